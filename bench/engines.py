"""Engine benchmark: map time, anonymous memory, latency, against sentence-transformers.

    python -m bench.engines [--package DIR] [--package-int8 DIR] [--runs-small 50] [--runs-large 10] [--rounds 5]
                            [--json PATH]

Each engine, and the sentence-transformers baseline, runs in its own fresh process, so one
library's imports and allocations never count against another; the timed bursts rotate
between the processes (``--rounds``) so that load from elsewhere hits all of them alike. Per engine it reports:

* map time: ``load_engine`` after the library is imported (ms; page cache warm);
* RssAnon delta of that load (MiB) and as a share of the weight file;
* first-inference latency of each shape (the first call, cold kernels) and the steady state
  after 3 burn-in calls (min / median / p95 ms over the measured runs);
* the ratio of each engine's steady-state median to the baseline's.

The baseline is ``SentenceTransformer(...).forward`` on the same padded token tensors (model
compute only, like the engines; no tokenisation). Goals: map <= 100 ms, ratio <= 1.0.
Prints a table and one summary line, and writes a JSON record.

An int8 package (``edge-package build --quantize int8``; ``--package-int8``, or the package's own
fallback package when it is one) runs as one more kind, ``onnxruntime-int8``, never judged: the
size ratio (its model.ort / the full one's) and the speed ratio (its steady-state median / the
full onnxruntime's, per shape) go in the table, the summary line and the JSON (``int8``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHAPES = [(1, 32), (32, 128)]  # (rows, tokens)
MAP_GOAL_MS = 100.0
RATIO_GOAL = 1.0
ENGINES = ("onnxruntime", "torchscript")  # default settings: what the goals are judged on
# Shown for the trade-off, not judged: ORT with MLAS pre-packing (faster GEMMs, copies weights).
VARIANTS = {"onnxruntime+prepacking": ("onnxruntime", {"prepacking": True})}
INT8 = "onnxruntime-int8"  # the int8 package on the default ORT settings: shown beside the full one, not judged


def rss_anon() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def _batch(rows: int, tokens: int):
    import numpy as np

    rng = np.random.default_rng(rows * 1000 + tokens)
    ids = rng.integers(1996, 29000, size=(rows, tokens), dtype=np.int64)  # ordinary word pieces
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
    return ids, np.ones_like(ids)


def _stats(samples: list[float]) -> dict:
    import numpy as np

    s = np.asarray(samples)
    return {"min_ms": float(s.min()), "median_ms": float(np.median(s)), "p95_ms": float(np.percentile(s, 95)),
            "runs": len(samples)}


def _load(kind: str, package: Path):
    """Import, then load one engine (or the baseline); returns (record, {shape: callable})."""
    t0 = time.perf_counter()
    if kind == "sentence-transformers":
        os.environ["HF_HUB_OFFLINE"] = "1"
        import torch
        from sentence_transformers import SentenceTransformer

        from image.package import source_dir

        import_ms = (time.perf_counter() - t0) * 1e3
        before = rss_anon()
        t = time.perf_counter()
        model = SentenceTransformer(str(source_dir()), device="cpu")
        model.eval()
        map_ms = (time.perf_counter() - t) * 1e3
        delta = rss_anon() - before
        weight_bytes = (source_dir() / "model.safetensors").stat().st_size

        def make(ids, mask):
            feats = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask),
                     "token_type_ids": torch.zeros_like(torch.from_numpy(ids))}

            def fn():
                with torch.inference_mode():
                    return model.forward(dict(feats))["sentence_embedding"].numpy()
            return fn
        info = {"device": "cpu", "torch_threads": torch.get_num_threads()}
    else:
        from edge.engines import import_engine, load_engine
        from edge.preload.manifest import open_package

        engine_name, options = VARIANTS.get(kind, ("onnxruntime", {}) if kind == INT8 else (kind, {}))
        import_engine(engine_name)
        pkg = open_package(package, verify="size")
        import_ms = (time.perf_counter() - t0) * 1e3
        before = rss_anon()
        t = time.perf_counter()
        engine = load_engine(pkg, engine_name, device="cpu", **options)
        map_ms = (time.perf_counter() - t) * 1e3
        delta = rss_anon() - before
        weight_bytes = pkg.manifest.files[engine.info.get("weights", engine.info["file"])].size

        def make(ids, mask):
            return lambda: engine.run(ids, mask)
        info = {"device": engine.device, **engine.info}
    fns = {f"{r}x{t}": make(*_batch(r, t)) for r, t in SHAPES}
    record = {"kind": kind, "import_ms": import_ms, "map_ms": map_ms, "rss_anon_delta": delta,
              "weight_bytes": weight_bytes, "info": info}
    return record, fns


def child(kind: str, package: Path) -> None:
    """Serve timing requests from the parent: one JSON line in, one out (after the load record).

    Request ``{"shape": "1x32", "runs": n}``: the first request of a shape also returns the
    first-call latency and runs the 3 burn-in calls.
    """
    record, fns = _load(kind, package)
    print(json.dumps(record), flush=True)
    seen: set[str] = set()
    for line in sys.stdin:
        req = json.loads(line)
        fn, reply = fns[req["shape"]], {}
        if req["shape"] not in seen:
            seen.add(req["shape"])
            t = time.perf_counter()
            fn()
            reply["first_ms"] = (time.perf_counter() - t) * 1e3
            for _ in range(3):  # burn-in: TorchScript's profiling executor needs 2-3 calls per shape
                fn()
        samples, cpu = [], []
        for _ in range(req["runs"]):
            c = time.process_time()
            t = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t) * 1e3)
            cpu.append((time.process_time() - c) * 1e3)
        reply["samples"], reply["cpu"] = samples, cpu
        print(json.dumps(reply), flush=True)


class _Child:
    def __init__(self, kind: str, package: Path) -> None:
        self.kind = kind
        cmd = [sys.executable, "-m", "bench.engines", "--child", kind, "--package", str(package)]
        self.proc = subprocess.Popen(cmd,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
        self.record = self._read()
        self.record["latency"] = {}
        self.samples: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            raise SystemExit(f"{self.kind}: child exited ({self.proc.returncode})")
        return json.loads(line)

    def measure(self, shape: str, runs: int) -> None:
        self.proc.stdin.write(json.dumps({"shape": shape, "runs": runs}) + "\n")
        self.proc.stdin.flush()
        reply = self._read()
        if "first_ms" in reply:
            self.record["latency"][shape] = {"first_ms": reply["first_ms"]}
        self.samples.setdefault(shape, []).extend(reply["samples"])
        self.cpu.setdefault(shape, []).extend(reply["cpu"])

    def finish(self) -> dict:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        for shape, samples in self.samples.items():
            self.record["latency"][shape].update(_stats(samples))
            # CPU time of the process per call (all threads): less swayed by other load than wall time.
            self.record["latency"][shape]["cpu_median_ms"] = float(sorted(self.cpu[shape])[len(self.cpu[shape]) // 2])
        return self.record


def _ensure_package(path: Path | None) -> Path:
    if path is not None:
        return path
    from edge.errors import PackageError
    from edge.preload.manifest import open_package
    from image.package import build_package

    path = REPO / ".cache" / "bench" / "minilm"
    try:
        open_package(path, verify="size")
    except PackageError:
        print(f"building the package into {path} ...", file=sys.stderr)
        build_package(path)
    return path


def _int8_package(package: Path, given: Path | None) -> Path | None:
    """``--package-int8``, else the package's fallback package when it is an int8 one on onnxruntime."""
    if given is not None:
        return given
    m = json.loads((package / "manifest.json").read_text())
    fb = m.get("fallback") or {}
    if fb.get("kind") == "package" and fb.get("engine") == "onnxruntime":
        sub = package / fb["path"]
        if "quantization" in json.loads((sub / "manifest.json").read_text()):
            return sub
    return None


def _int8_ratios(full: dict, int8: dict, package: Path, shapes) -> dict:
    """The int8 package against the full one on onnxruntime: model size and steady-state median per shape."""
    measured = json.loads((package / "manifest.json").read_text()).get("quantization", {}).get("measured", {})
    return {"package": str(package), "size_ratio": int8["weight_bytes"] / full["weight_bytes"],
            "model_bytes": int8["weight_bytes"], "full_model_bytes": full["weight_bytes"],
            "speed_ratio": {k: int8["latency"][k]["median_ms"] / full["latency"][k]["median_ms"] for k in shapes},
            "cpu_speed_ratio": {k: int8["latency"][k]["cpu_median_ms"] / full["latency"][k]["cpu_median_ms"]
                                for k in shapes},
            "cosine_min": measured.get("cosine_min"), "cosine_mean": measured.get("cosine_mean")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", type=Path, help="model package (default: build one under .cache/bench)")
    parser.add_argument("--package-int8", type=Path, metavar="DIR",
                        help="an int8 package (edge-package build --quantize int8) to time beside the full one "
                             "(default: the package's fallback package, when it is one)")
    parser.add_argument("--runs-small", type=int, default=50, help="measured runs at 1x32")
    parser.add_argument("--runs-large", type=int, default=10, help="measured runs at 32x128")
    parser.add_argument("--rounds", type=int, default=5, help="bursts per engine and shape, interleaved")
    parser.add_argument("--json", type=Path, default=REPO / ".cache" / "bench" / "engines.json")
    parser.add_argument("--no-variants", dest="variants", action="store_false",
                        help="skip the non-default settings shown for comparison (ORT with pre-packing)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    runs = {"1x32": args.runs_small, "32x128": args.runs_large}
    if args.child:
        child(args.child, args.package)
        return 0

    package = _ensure_package(args.package)
    int8_package = _int8_package(package, args.package_int8)
    # Loads run one after another (each measured alone); then the timing bursts rotate
    # between the processes, so a noisy neighbour slows every engine alike.
    kinds = ["sentence-transformers", *ENGINES, *(VARIANTS if args.variants else ()), *([INT8] if int8_package else [])]
    children = [_Child(kind, int8_package if kind == INT8 else package) for kind in kinds]
    rounds = args.rounds
    for r in range(rounds):
        for shape, total in runs.items():
            burst = max(1, total // rounds)
            order = children[r % len(children):] + children[: r % len(children)]
            for c in order:
                c.measure(shape, burst)
    records = [c.finish() for c in children]
    base = records[0]
    mib = 2**20
    print(f"{'':24}{'map ms':>8}{'RssAnon MiB':>13}{'% weights':>10}  "
          + "".join(f"{k + ' first/med/p95 ms':>30}{'ratio':>7}" for k in runs))
    ok = True
    for r in records:
        line = (f"{r['kind']:24}{r['map_ms']:8.1f}{r['rss_anon_delta'] / mib:13.1f}"
                f"{100 * r['rss_anon_delta'] / r['weight_bytes']:9.1f}%  ")
        r["ratio"], r["cpu_ratio"] = {}, {}
        for k in runs:
            lat, ref = r["latency"][k], base["latency"][k]
            ratio = lat["median_ms"] / ref["median_ms"]
            r["ratio"][k] = ratio
            r["cpu_ratio"][k] = lat["cpu_median_ms"] / ref["cpu_median_ms"]
            line += f"{lat['first_ms']:12.1f} /{lat['median_ms']:7.1f} /{lat['p95_ms']:7.1f}{ratio:7.2f}"
            if r["kind"] in ENGINES:
                ok &= ratio <= RATIO_GOAL
        if r["kind"] in ENGINES:
            ok &= r["map_ms"] <= MAP_GOAL_MS
        print(line)
    summary = " | ".join(
        f"{r['kind']}: map {r['map_ms']:.0f} ms, anon +{r['rss_anon_delta'] / mib:.1f} MiB, "
        + ", ".join(f"{k} x{r['ratio'][k]:.2f} (cpu x{r['cpu_ratio'][k]:.2f})" for k in runs)
        for r in records[1:]
    )
    int8 = None
    if int8_package:
        by_kind = {r["kind"]: r for r in records}
        int8 = _int8_ratios(by_kind["onnxruntime"], by_kind[INT8], int8_package, runs)
        ratios = (f"int8 / full (onnxruntime): size x{int8['size_ratio']:.2f}, "
                  + ", ".join(f"{k} x{int8['speed_ratio'][k]:.2f} (cpu x{int8['cpu_speed_ratio'][k]:.2f})"
                              for k in runs))
        print(f"{'':24}{ratios}")
        summary += f" | {ratios}"
    goals = (f"goals of the default engines (map <= {MAP_GOAL_MS:.0f} ms, ratio <= {RATIO_GOAL}): "
             f"{'met' if ok else 'NOT met'}")
    print(f"engines: {summary} | {goals} | load avg {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "package": str(package), "cpus": os.cpu_count(),
              "load_avg": os.getloadavg(), "records": records, "goals_met": ok}
    if int8 is not None:
        record["int8"] = int8
    args.json.write_text(json.dumps(record, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
