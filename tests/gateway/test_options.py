"""`edge gateway`'s checks before anything starts: loopback by default, no exposed listener
without a bearer token or TLS, the token file's rules."""

from __future__ import annotations

import pytest

from edge.config.command_line import UsageError
from edge.gateway.main import run_gateway
from edge.gateway.options import check_exposure, gateway_parser, parse_listen, read_api_key


def test_the_default_listener_is_loopback():
    listen = parse_listen(gateway_parser().parse_args([]).listen)
    assert (listen.host, listen.port, listen.loopback) == ("127.0.0.1", 8080, True)


@pytest.mark.parametrize("text,loopback", [("127.0.0.1:1", True), ("[::1]:1", True), ("localhost:1", True),
                                           ("0.0.0.0:1", False), (":1", False), ("*:1", False),
                                           ("192.168.1.5:1", False), ("jetson.local:1", False)])
def test_loopback_or_not(text, loopback):
    assert parse_listen(text).loopback is loopback


def test_an_exposed_listener_needs_a_token_or_tls():
    exposed = parse_listen("0.0.0.0:8080")
    with pytest.raises(UsageError, match="api-key-file"):
        check_exposure(exposed, None, False)
    check_exposure(exposed, "/etc/edge/gateway.token", False)
    check_exposure(exposed, None, True)
    check_exposure(parse_listen("127.0.0.1:8080"), None, False)


def test_the_command_refuses_an_exposed_listener_with_exit_2(capsys):
    assert run_gateway(["--listen", "0.0.0.0:18999"]) == 2
    assert "not a loopback address" in capsys.readouterr().err


def test_token_file_rules(tmp_path):
    short = tmp_path / "short"
    short.write_text("abc\n")
    with pytest.raises(UsageError, match="at least 16"):
        read_api_key(str(short))
    good = tmp_path / "good"
    good.write_text("0123456789abcdef0123\n")
    assert read_api_key(str(good)) == b"0123456789abcdef0123"
    with pytest.raises(UsageError, match="No such file"):
        read_api_key(str(tmp_path / "absent"))


@pytest.mark.parametrize("bad", ["8080", "host:", "host:99999"])
def test_bad_listen(bad):
    with pytest.raises(UsageError):
        parse_listen(bad)
