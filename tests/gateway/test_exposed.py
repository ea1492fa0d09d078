"""`edge gateway` listening beyond loopback, as a device serving its network would (``--listen
0.0.0.0:PORT``), reached at this machine's own non-loopback address, in front of a real runtime
(MiniLM, ONNX Runtime), with the real clients (`openai`, huggingface_hub's InferenceClient):

- a bearer token (``--api-key-file``): the right token gets embeddings equal to the runtime's;
  a missing, wrong or undecodable one is a 401 in each API's own error shape (openai's
  AuthenticationError, HfHubHTTPError), with the trace id in the body and ``X-Trace-Id``, on
  every route but /health, unknown routes included (no route probing without the token);
- TLS (``--tls-cert``/``--tls-key``, a CA and a certificate made here for this address): a client
  verifying against that CA gets embeddings, one trusting only the system's CAs refuses the
  certificate, a plain-HTTP request gets no HTTP answer, and a connection that never starts its
  handshake is closed after ``--idle-timeout``;
- both at once: TLS, and the token still required inside it.
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
import ssl
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import httpx2
import huggingface_hub
import numpy as np
import openai
import pytest
from huggingface_hub import constants as hub_constants
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.utils import _http as hub_http

from edge.ipc.client import EdgeClient
from support.gateway_proc import exposed_host, start_gateway
from support.runtime_proc import running_runtime

pytestmark = pytest.mark.process

TEXTS = ["The conveyor belt stopped at 14:02.", "Der Sensor meldet eine Übertemperatur.", "hello world"]
MODEL = "all-MiniLM-L6-v2"
IDLE_S = 1.0  # --idle-timeout of the TLS gateways: a silent handshake is closed after it
# Where clients reach a gateway on 0.0.0.0: this machine's address on its network, else loopback
# (the token and TLS are then still checked, only not over a network interface).
HOST = exposed_host() or "127.0.0.1"


@pytest.fixture(scope="module")
def runtime(minilm_package, tmp_path_factory):
    with running_runtime(tmp_path_factory.mktemp("exposed-rt"), "--package", str(minilm_package), "--engine",
                       "onnxruntime", "--fallback", "off") as rt:
        yield rt


@pytest.fixture(scope="module")
def reference(runtime) -> np.ndarray:
    with EdgeClient(runtime.address, timeout_s=30) as c:
        return c.embed(TEXTS).embeddings


@pytest.fixture(scope="module")
def token(tmp_path_factory) -> tuple[str, Path]:
    value = secrets.token_urlsafe(32)
    path = tmp_path_factory.mktemp("token") / "gateway.token"
    path.write_text(value + "\n")
    path.chmod(0o600)
    return value, path


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> dict[str, Path]:
    return make_ca_and_certificate(tmp_path_factory.mktemp("tls"), [HOST, "127.0.0.1", "localhost"])


def make_ca_and_certificate(d: Path, names: list[str]) -> dict[str, Path]:
    """A CA, and a server certificate it signs for ``names`` (IP addresses or DNS names), valid for a day."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.now(timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edge test CA")])
    usage = dict(content_commitment=False, key_encipherment=False, data_encipherment=False, key_agreement=False,
                 encipher_only=False, decipher_only=False)
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(minutes=5))
          .not_valid_after(now + timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, **usage),
                         critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    alt = []
    for n in names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            alt.append(x509.DNSName(n))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edge gateway")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False, **usage),
                           critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    out = {"ca": d / "ca.pem", "cert": d / "gateway.pem", "key": d / "gateway.key"}
    out["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    out["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    out["key"].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()))
    out["key"].chmod(0o600)
    return out


def _gateway(tmp_path_factory, runtime, name: str, *args: str):
    gw = start_gateway(tmp_path_factory.mktemp(name), runtime.address, *args, listen="0.0.0.0:0", host=HOST)
    try:
        yield gw
    finally:
        assert gw.stop() == 0, gw.output()


@pytest.fixture(scope="module")
def token_gw(tmp_path_factory, runtime, token):
    yield from _gateway(tmp_path_factory, runtime, "gw-token", "--api-key-file", str(token[1]))


@pytest.fixture(scope="module")
def tls_gw(tmp_path_factory, runtime, tls):
    yield from _gateway(tmp_path_factory, runtime, "gw-tls", "--tls-cert", str(tls["cert"]), "--tls-key",
                        str(tls["key"]), "--idle-timeout", str(IDLE_S))


@pytest.fixture(scope="module")
def both_gw(tmp_path_factory, runtime, token, tls):
    yield from _gateway(tmp_path_factory, runtime, "gw-both", "--api-key-file", str(token[1]), "--tls-cert",
                        str(tls["cert"]), "--tls-key", str(tls["key"]))


@pytest.fixture
def hub_trusts(tls):
    """huggingface_hub's one shared HTTP client, verifying against the test's CA (its documented
    hook, set_client_factory); the default factory back afterwards."""
    ctx = ssl.create_default_context(cafile=str(tls["ca"]))
    huggingface_hub.set_client_factory(lambda: httpx2.Client(verify=ctx, follow_redirects=True, timeout=30))
    try:
        yield
    finally:
        huggingface_hub.set_client_factory(hub_http.default_client_factory)


def assert_same(got, want) -> None:
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.9999, cos


def openai_client(gw, api_key: str, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=api_key, max_retries=0, timeout=30, **kw)


def trusting(tls) -> httpx.Client:
    return openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=str(tls["ca"])))


def raw_request(gw, head: bytes) -> bytes:
    """Send ``head`` (a request without a body) on a socket of its own; the whole answer."""
    with socket.create_connection((HOST, gw.port), timeout=30) as s:
        s.sendall(head)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def assert_openai_401(exc: openai.AuthenticationError) -> None:
    assert exc.status_code == 401, exc
    assert exc.body["code"] == "invalid_api_key" and exc.body["type"] == "invalid_request_error", exc.body
    assert exc.body["trace_id"] and exc.response.headers["X-Trace-Id"] == exc.body["trace_id"]
    assert exc.response.headers["WWW-Authenticate"].startswith("Bearer")


def assert_tei_401(exc: HfHubHTTPError) -> None:
    r = exc.response
    assert r.status_code == 401, exc
    body = r.json()
    assert body["error_type"] == "Unauthorized" and "bearer token" in body["error"], body
    assert body["trace_id"] and r.headers["X-Trace-Id"] == body["trace_id"]


def test_the_listener_is_exposed_and_the_right_token_gets_embeddings(token_gw, token, reference):
    assert token_gw.url.startswith(f"http://{HOST}:")
    res = openai_client(token_gw, token[0]).embeddings.create(model=MODEL, input=TEXTS)
    assert_same([d.embedding for d in res.data], reference)
    hub = huggingface_hub.InferenceClient(model=token_gw.url + "/embed", token=token[0])
    for i, text in enumerate(TEXTS):
        assert_same(hub.feature_extraction(text), reference[i:i + 1])


def test_a_missing_or_wrong_token_is_401_in_each_apis_shape(token_gw, token, monkeypatch):
    wrong_same_length = "x" * len(token[0])
    for key in (wrong_same_length, token[0][:-1], token[0] + "x", "short"):
        with pytest.raises(openai.AuthenticationError) as exc:
            openai_client(token_gw, key).embeddings.create(model=MODEL, input="hello")
        assert_openai_401(exc.value)
    with pytest.raises(openai.AuthenticationError) as exc:
        openai_client(token_gw, token[0]).embeddings.create(model=MODEL, input="hello",
                                                            extra_headers={"Authorization": openai.Omit()})
    assert_openai_401(exc.value)  # no Authorization header at all
    with pytest.raises(openai.AuthenticationError):
        openai_client(token_gw, wrong_same_length).models.list()
    # token=None and no implicit token (a login's, HF_TOKEN): huggingface_hub sends no Authorization header
    monkeypatch.setattr(hub_constants, "HF_HUB_DISABLE_IMPLICIT_TOKEN", True)
    for hub_token in ("wrong-" + token[0], None):
        with pytest.raises(HfHubHTTPError) as hf:
            huggingface_hub.InferenceClient(model=token_gw.url + "/embed", token=hub_token).feature_extraction("x")
        assert_tei_401(hf.value)


def test_only_health_is_open_without_the_token(token_gw, token):
    ok = httpx.get(token_gw.url + "/health", timeout=10)
    assert ok.status_code == 200 and ok.json()["status"] == "ok"
    for path in ("/metrics", "/info", "/v1/models", "/no/such/route"):
        r = httpx.get(token_gw.url + path, timeout=10)
        body = r.json()
        trace = body["error"]["trace_id"] if path.startswith("/v1/") else body["trace_id"]  # OpenAI's shape, TEI's
        assert r.status_code == 401 and trace == r.headers["X-Trace-Id"], (path, r.text)
    r = httpx.get(token_gw.url + "/metrics", headers={"Authorization": f"Bearer {token[0]}"}, timeout=10)
    assert r.status_code == 200 and 'status="401"' in r.text, r.text
    # A header that is not UTF-8 is a wrong token too, not a server error.
    answer = raw_request(token_gw, b"GET /info HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\n"
                                   b"Connection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]


def test_tls_with_the_tests_ca(tls_gw, tls, reference, hub_trusts):
    assert tls_gw.url.startswith(f"https://{HOST}:")
    res = openai_client(tls_gw, "unused", http_client=trusting(tls)).embeddings.create(model=MODEL, input=TEXTS)
    assert_same([d.embedding for d in res.data], reference)
    assert_same(huggingface_hub.InferenceClient(model=tls_gw.url + "/embed").feature_extraction(TEXTS[0]),
                reference[:1])
    # The system's CAs do not know this one: the certificate is refused, nothing is sent.
    with pytest.raises(openai.APIConnectionError) as exc:
        openai_client(tls_gw, "unused").embeddings.create(model=MODEL, input="hello")
    assert "CERTIFICATE_VERIFY_FAILED" in repr(exc.value.__cause__), repr(exc.value.__cause__)


def test_tls_refuses_plain_http_and_silent_handshakes(tls_gw, tls):
    plain = tls_gw.url.replace("https://", "http://")
    with pytest.raises(openai.APIConnectionError):
        openai.OpenAI(base_url=plain + "/v1", api_key="unused", max_retries=0, timeout=10).models.list()
    answer = raw_request(tls_gw, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert b"HTTP/" not in answer, answer[:200]  # the handshake fails: no HTTP reply, the connection closed
    # A connection that never sends its ClientHello is closed after --idle-timeout, as idle headers are.
    with socket.create_connection((HOST, tls_gw.port), timeout=30) as s:
        t0 = time.monotonic()
        assert s.recv(1) == b""
        waited = time.monotonic() - t0
    assert IDLE_S * 0.9 <= waited < 20, waited  # asyncio's own bound is 60 s
    r = httpx.get(tls_gw.url + "/health", verify=ssl.create_default_context(cafile=str(tls["ca"])), timeout=10)
    assert r.status_code == 200  # and it goes on serving


def test_tls_and_token_together(both_gw, token, tls, reference, hub_trusts):
    res = openai_client(both_gw, token[0], http_client=trusting(tls)).embeddings.create(model=MODEL, input=TEXTS)
    assert_same([d.embedding for d in res.data], reference)
    with pytest.raises(openai.AuthenticationError) as exc:
        openai_client(both_gw, "wrong-" + token[0], http_client=trusting(tls)).embeddings.create(model=MODEL,
                                                                                                  input="hello")
    assert_openai_401(exc.value)
    hub = huggingface_hub.InferenceClient(model=both_gw.url + "/embed", token=token[0])
    assert_same(hub.feature_extraction(TEXTS[1]), reference[1:2])
    with pytest.raises(HfHubHTTPError) as hf:
        huggingface_hub.InferenceClient(model=both_gw.url + "/embed", token="wrong-" + token[0]).feature_extraction("x")
    assert_tei_401(hf.value)
