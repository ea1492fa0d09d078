"""A server that takes another's ipc address over (an update's handover, docs/update.md): new
connections reach it at once, the old server answers its own connections until it drains, and no
stop or parking of the old one removes or moves the new one's socket file. Real sockets."""

from __future__ import annotations

import os
import time

import pytest

from edge.ipc.client import EdgeClient
NEW = {"model_sha256": "n" * 64, "tokenizer_sha256": "t" * 64, "package_sha256": "p" * 64}  # the old one's: m


def served_by(client: EdgeClient) -> str:
    return client.embed(["hello"]).meta["model_sha256"][0]


def path_of(server) -> str:
    return server.address[len("ipc://"):]


def test_new_connections_reach_the_new_server_and_the_old_one_answers_its_own(make_server, make_client, sock_dir):
    old = make_server()
    live = path_of(old)
    kept = make_client(old)
    assert served_by(kept) == "m"
    new = make_server(name=".edge.sock.b", lineage=NEW)
    own = path_of(new)
    inode = os.stat(own).st_ino
    new.take_over(old.address)
    assert os.stat(live).st_ino == inode and not os.path.exists(own)
    assert new.address == old.address
    assert served_by(make_client(live)) == "n"  # a new connection: the new server
    assert served_by(kept) == "m"  # an open one: still the old server's
    old.request_drain()
    assert old.wait(10.0)
    assert old.handed_over
    assert os.stat(live).st_ino == inode  # the old server's stop left the new one's file
    assert served_by(make_client(live)) == "n"
    new.request_drain()
    assert new.wait(10.0) and not new.handed_over
    assert not os.path.exists(live)  # the new server's own stop removes it, at its new name


def test_an_old_server_parked_at_its_cap_never_moves_the_new_ones_file(make_server, make_client):
    old = make_server(max_connections=4)
    live = path_of(old)
    clients = [make_client(old) for _ in range(4)]
    for c in clients:
        c.health()
    deadline = time.monotonic() + 10
    while not old._conns.parked and time.monotonic() < deadline:  # the I/O thread parks on the next event
        clients[0].health()
        time.sleep(0.02)
    assert old._conns.parked and not os.path.exists(live)
    new = make_server(name=".edge.sock.b", lineage=NEW)
    inode = os.stat(path_of(new)).st_ino
    new.take_over(old.address)
    for c in clients[:3]:  # below the old server's resume count: it would put its file back
        c.close()
    clients[3].health()  # an event for the old server's I/O thread
    deadline = time.monotonic() + 10
    while not old.handed_over and time.monotonic() < deadline:
        clients[3].health()
        time.sleep(0.02)
    assert old.handed_over and os.stat(live).st_ino == inode
    assert served_by(make_client(live)) == "n"
    old.request_drain()
    assert old.wait(10.0) and os.stat(live).st_ino == inode


def test_take_over_refuses_a_socket_file_that_is_not_its_own(make_server, sock_dir):
    old = make_server()
    new = make_server(name=".edge.sock.b", lineage=NEW)
    os.unlink(path_of(new))
    with pytest.raises(OSError):
        new.take_over(old.address)
    assert not old.handed_over and os.path.exists(path_of(old))
