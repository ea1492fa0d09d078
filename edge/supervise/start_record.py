"""How this start went: ``$RUNTIME_DIRECTORY/start.json`` (docs/field.md, ``edge-coldstart --unit``)."""

import json
import os
import threading
import time

START_RECORD = "start.json"  # in the unit's RuntimeDirectory (docs/field.md, edge-coldstart --unit)


class StartRecord:
    """How this start went: ``$RUNTIME_DIRECTORY/start.json``, rewritten whole (write, rename) at
    each step. ``boottime_ns`` holds CLOCK_BOOTTIME instants: ``supervisor`` (this process at
    work), ``runc`` (just before ``runc run`` or ``runc restore``), ``ready`` (READY passed on);
    ``start`` says fresh or restored, ``snapshot`` what became of the background snapshot (off,
    none, taking, taken, failed). ``edge-coldstart --unit`` splits a start into phases with it and
    waits for ``taking`` to end before its next run. Without a RuntimeDirectory (run by hand)
    nothing is written; a write that fails never fails the start."""

    def __init__(self, directory, **fields):
        self.path = os.path.join(directory, START_RECORD) if directory else None
        self.data = {"format": 1, "pid": os.getpid(), "boottime_ns": {}, **fields}
        self._lock = threading.Lock()

    def stamp(self, name=None, **fields):
        with self._lock:
            if name:
                self.data["boottime_ns"][name] = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
            self.data.update(fields)
            if self.path is None:
                return
            try:
                tmp = f"{self.path}.{os.getpid()}.tmp"
                with open(tmp, "w") as f:
                    json.dump(self.data, f)
                os.replace(tmp, self.path)
            except OSError:
                pass
