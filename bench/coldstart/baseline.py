"""The glue baseline: what people usually deploy, as one fresh process.

    python bench/coldstart/baseline.py MODEL_DIR TEXT [--list-files]
    python bench/coldstart/baseline.py --import-only MODULE [--list-files]

It imports sentence-transformers, loads the model from its ``model.safetensors`` and
``tokenizer.json`` and encodes one text, then prints one JSON line: the embedding (float32,
little-endian, base64) and its phases in ms since exec. The launcher stops its clock when it
has read and checked that line, so interpreter teardown (about 0.9 s after torch) is not
counted. ``--import-only torch`` times a bare ``import torch`` the same way (the goal of the
TorchScript engine is stated against it). ``--list-files`` adds a second line with every file
the process opened or mapped (for the cold-cache eviction list).

Run it by path, not ``-m``: it must not import ``bench`` or ``edge``. The launcher passes
``EDGE_EXEC_BOOTTIME_NS`` (CLOCK_BOOTTIME just before exec) so both clocks share an origin.
"""

import time

_START_NS = time.clock_gettime_ns(time.CLOCK_BOOTTIME)

import base64  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

_opened: set = set()


def _audit(event, args):
    if event == "open" and args and isinstance(args[0], (str, bytes)):
        _opened.add(os.fsdecode(args[0]))


def _ms(ns: int, exec_ns: int) -> float:
    return round((ns - exec_ns) / 1e6, 3)


def _files() -> list[str]:
    files = {os.path.abspath(p) for p in _opened}
    files.update(getattr(m, "__file__", None) or "" for m in list(sys.modules.values()))
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/"):
                    files.add(parts[5].strip())
    except OSError:
        pass
    return sorted(p for p in files if p and os.path.isfile(p))


def main(argv: list[str]) -> int:
    list_files = "--list-files" in argv
    if list_files:
        argv = [a for a in argv if a != "--list-files"]
        sys.addaudithook(_audit)
    exec_ns = int(os.environ.get("EDGE_EXEC_BOOTTIME_NS") or _START_NS)
    phases = {"interpreter": [0.0, _ms(_START_NS, exec_ns)]}
    record: dict = {"pid": os.getpid()}
    if argv[:1] == ["--import-only"]:
        t = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        __import__(argv[1])
        phases[f"import_{argv[1]}"] = [_ms(t, exec_ns), _ms(time.clock_gettime_ns(time.CLOCK_BOOTTIME), exec_ns)]
    else:
        model_dir, text = argv[0], argv[1]
        t = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        from sentence_transformers import SentenceTransformer

        t1 = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        phases["import_sentence_transformers"] = [_ms(t, exec_ns), _ms(t1, exec_ns)]
        model = SentenceTransformer(model_dir, device="cpu")
        t2 = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        phases["load_model"] = [_ms(t1, exec_ns), _ms(t2, exec_ns)]
        emb = model.encode([text], convert_to_numpy=True)[0].astype("<f4")  # (384,)
        t3 = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        phases["encode"] = [_ms(t2, exec_ns), _ms(t3, exec_ns)]
        record["embedding_f32le_b64"] = base64.b64encode(emb.tobytes()).decode()
    record["phases"] = phases
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()
    if list_files:
        sys.stdout.write(json.dumps({"files": _files()}) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
