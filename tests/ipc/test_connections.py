"""edge/ipc/connections.py on a real ROUTER: the connection a message came on, even when the
message is read before the monitor's ACCEPTED event (the two come through different pipes)."""

from __future__ import annotations

import os
import tempfile

import zmq

from edge.ipc.connections import UNKNOWN_CONN, Connections


def test_a_message_read_before_its_accepted_event_still_names_its_connection():
    d = tempfile.mkdtemp(prefix="edge-conn-", dir="/tmp")
    path = os.path.join(d, "s.sock")
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    conns = Connections(router, path, cap=16)  # the monitor before bind, as the server attaches it
    router.bind(f"ipc://{path}")
    dealer = ctx.socket(zmq.DEALER)
    try:
        dealer.connect(f"ipc://{path}")
        dealer.send(b"hello")
        assert router.poll(5000), "no message"
        frames = router.recv_multipart(copy=False)  # read first; no update() has read the monitor yet
        last = frames[-1]
        conn = conns.conn_of(last.get(zmq.SRCFD), last.get("Peer-Address"))
        assert conn != UNKNOWN_CONN and conns.is_open(conn)
        assert conns.count == 1
    finally:
        dealer.close(0)
        conns.close()
        router.close(0)
        ctx.term()
        for name in os.listdir(d):
            os.unlink(os.path.join(d, name))
        os.rmdir(d)
