"""The supervisor's log: one JSON object a line on stdout (the journal), whole lines also when a
restored container's output is forwarded to it from a thread."""

import collections
import json
import sys
import threading
import time

_out = threading.Lock()  # our log lines and a restored container's, whole lines each


def log(event, **fields):
    line = json.dumps({"ts": time.time(), "event": event, "source": "edge-supervise", **fields})
    with _out:
        print(line, flush=True)


class Output:
    """A container's stdout and stderr, one pipe (CRIU cannot dump a file outside the container),
    read on a thread so a full pipe never stops it: each line forwarded to ours (the journal), or
    only the last ones kept, for an error message."""

    def __init__(self, stream, forward):
        self.lines = collections.deque(maxlen=40)
        self._thread = threading.Thread(target=self._read, args=(stream, forward), daemon=True)
        self._thread.start()

    def _read(self, stream, forward):
        for line in stream:
            self.lines.append(line)
            if forward:
                with _out:
                    sys.stdout.buffer.write(line)
                    sys.stdout.buffer.flush()

    def tail(self, chars=1500):
        return b"".join(self.lines).decode(errors="replace")[-chars:].strip()

    def join(self, timeout):
        self._thread.join(timeout)


def log_tail(path, chars=1500):
    try:
        with open(path, errors="replace") as f:
            return f.read()[-chars:]
    except OSError:
        return ""

