"""The floor: how fast can any Python process start, bind a ZeroMQ socket and answer?

    python -S bench/coldstart/floor.py --bind ipc:///PATH/floor.sock --embedding-hex HEX
    python -S -c "$(cat bench/coldstart/floor.py)" --bind ... --embedding-hex ...   (in a container)

Started with the runtime's interpreter and flags, it imports numpy, zmq and msgpack (the
protocol's encoding), binds one ROUTER socket at ``--bind`` and answers every ``infer``
request (protocol v1, docs/protocol.md) with the embedding it was given (``--embedding-hex``:
float32 little-endian, as hex): the benchmark's own client (``bench/coldstart/client.py``)
then gets a reply that passes its check, so exec to first reply is measured the same way for
the floor and for the runtime. No model, no tokenizer, no ``edge``: nothing a runtime could
leave out. It serves until SIGTERM (a handler: as a container's PID 1 the default action would
be ignored; it polls every 50 ms so the handler gets its turn) and removes its socket file when
it stops.

Its reply body carries ``floor: true``, its pid, the address it bound and its stages
(``stages_boottime_ns``: CLOCK_BOOTTIME when its first line ran and after each import and the
bind; the benchmark puts them on its own clock). Standard library, numpy, zmq and msgpack only;
argument parsing by hand (argparse alone would cost milliseconds).
"""

import time

_T_START = time.clock_gettime_ns(time.CLOCK_BOOTTIME)

import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402


POLL_MS = 50  # how often the serving loop gives a pending SIGTERM's handler its turn (untimed: the stop)


def _now() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def _stop(_signum, _frame):
    raise SystemExit(0)


def main(argv: list) -> int:
    opts = dict(zip(argv[::2], argv[1::2]))
    address, hexed = opts.get("--bind"), opts.get("--embedding-hex")
    if not address or not hexed or len(argv) % 2:
        sys.stderr.write("usage: floor.py --bind ADDRESS --embedding-hex HEX\n")
        return 2
    signal.signal(signal.SIGTERM, _stop)
    stages = {"start": _T_START}
    import numpy as np

    stages["import_numpy"] = _now()
    import msgpack
    import zmq

    stages["import_zmq"] = _now()
    embedding = np.frombuffer(bytes.fromhex(hexed), dtype="<f4")
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(address)
    stages["bind"] = _now()
    path = address[len("ipc://"):] if address.startswith("ipc://") else None
    try:
        while True:
            # A poll with a timeout, not a blocking recv: a SIGTERM that one of libzmq's threads
            # takes would not wake a recv, and the handler runs only once Python has control.
            if not sock.poll(POLL_MS):
                continue
            frames = sock.recv_multipart()
            ident, head, body = frames[0], frames[-2], frames[-1]
            header = msgpack.unpackb(head)
            request = msgpack.unpackb(body)
            reply = {"trace_id": "%016x" % len(stages), "floor": True, "pid": os.getpid(), "address": address,
                     "stages_boottime_ns": stages}
            if "request_id" in request:
                reply["request_id"] = request["request_id"]
            extra = []
            if header.get("type") == "infer":
                count = len(request.get("texts") or [])
                reply.update(count=count, dim=int(embedding.size))
                extra = [embedding.tobytes() * count]
                rtype = "infer"
            elif header.get("type") in ("health", "stats"):
                reply.update(live=True, ready=True, state="ready")
                rtype = header["type"]
            else:
                reply.update(code=2, name="INVALID_TYPE", message="the floor answers infer, health and stats")
                rtype = "error"
            sock.send_multipart([ident, *frames[1:-2], msgpack.packb({"v": 1, "type": rtype}),
                                 msgpack.packb(reply), *extra])
    finally:
        sock.close(0)
        ctx.term()
        if path:
            try:
                os.unlink(path)
            except OSError:
                pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
