"""Child process for the no-copy tests: RssAnon before and after load_engine.

    python tests/engines/rss_probe.py PACKAGE_DIR ENGINE [OPTIONS_JSON]

The engine's library is loaded first (``import torch``; ONNX Runtime's C library), so the
delta is the load itself: mapping, session/module, assignment. Prints one JSON object.
"""

import json
import sys
import time


def rss_anon() -> int:
    """Anonymous resident memory of this process, bytes (RssAnon in /proc/self/status)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


def main() -> None:
    package, engine = sys.argv[1], sys.argv[2]
    options = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    import numpy as np

    from edge.engines import import_engine, load_engine
    from edge.preload.manifest import open_package

    import_engine(engine)  # import torch / load ORT's C library and create its OrtEnv
    pkg = open_package(package, verify="size")
    before = rss_anon()
    t0 = time.perf_counter()
    eng = load_engine(pkg, engine, device="cpu", **options)
    load_ms = (time.perf_counter() - t0) * 1e3
    after = rss_anon()
    ids = np.full((1, 32), 1000, dtype=np.int64)
    ids[0, 0], ids[0, -1] = 101, 102
    out = eng.run(ids, np.ones_like(ids))
    after_run = rss_anon()
    weight_bytes = pkg.manifest.files[eng.info["file"] if engine == "onnxruntime" else eng.info["weights"]].size
    print(json.dumps({"engine": engine, "before": before, "after_load": after, "after_first_run": after_run,
                      "delta_load": after - before, "delta_run": after_run - before, "weight_bytes": weight_bytes,
                      "load_ms": load_ms, "info": eng.info, "norm": float(np.linalg.norm(out))}))
    eng.close()


if __name__ == "__main__":
    main()
