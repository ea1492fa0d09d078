"""The machine: L4T release, Jetson module, nvpmodel mode, clocks, CUDA as the engines see it.

On a machine that is not a Jetson (no ``/etc/nv_tegra_release``, no Tegra device tree) the
Jetson checks are N/A, unless the installed bundle's archive asks for an L4T release or a
device: then a bundle built for a Jetson sits on another machine, which is a FAIL.
"""

from __future__ import annotations

import glob
import os
import re
import sys
from pathlib import Path

from edge.commands.doctor.context import Context, read_text
from edge.system.l4t import l4t_in_range, l4t_release
from edge.observability.telemetry.system import parse_power_models
from edge.commands.doctor.report import Check, Verdict

__all__ = ["check_l4t", "check_module", "check_nvpmodel", "check_clocks", "check_cuda"]

_GPU_DEVFREQ = re.compile(r"gpu|ga10b|gv11b|gp10b|gm20b")  # Orin, Xavier, TX2, Nano
REINSTALL = "install a bundle built for this device (edge-bundle install ARCHIVE; docs/update.md)"


def _compat(ctx: Context) -> dict:
    """The ``compatible`` block of the installed slot's edge-archive.json ({} when none)."""
    b = ctx.usable_bundle
    compat = (b.archive or {}).get("compatible") if b is not None else None
    return compat if isinstance(compat, dict) else {}


def check_l4t(ctx: Context) -> Check:
    path = ctx.path("/etc/nv_tegra_release")
    want = _compat(ctx).get("l4t") if isinstance(_compat(ctx).get("l4t"), dict) else None
    span = f"{(want or {}).get('min') or 'any'}-{(want or {}).get('max') or 'any'}"
    text = read_text(path, 4096)
    if text is None:
        if want:
            return Check("l4t", Verdict.FAIL, f"the installed bundle needs L4T {span}, and there is no "
                                              f"{path} (not a Jetson)", REINSTALL, {"required": want})
        return Check("l4t", Verdict.NA, f"not a Jetson: no {path}")
    release = l4t_release(text)
    first = text.strip().splitlines()[0] if text.strip() else ""
    if release is None:
        return Check("l4t", Verdict.WARN, f"{path} does not say which release: {first[:120]!r}",
                     "reflash L4T with NVIDIA's SDK Manager or flash.sh (the release file is part of it)",
                     {"line": first})
    fields = dict(re.findall(r"(BOARD|EABI|GCID|DATE):\s*([^,]+)", text))
    measured = {"release": release, "line": first, **{k.lower(): v.strip() for k, v in fields.items()}}
    if want and not l4t_in_range(release, want.get("min"), want.get("max")):
        return Check("l4t", Verdict.FAIL, f"L4T R{release}, and the installed bundle needs L4T {span}",
                     f"flash L4T {span}, or {REINSTALL}", {**measured, "required": want})
    also = f"; the bundle needs {span}" if want else ""
    return Check("l4t", Verdict.PASS, f"L4T R{release} (board {fields.get('BOARD', '?').strip()}, "
                                      f"{fields.get('EABI', '?').strip()}){also}", measured=measured)


def check_module(ctx: Context) -> Check:
    model = read_text(ctx.path("/proc/device-tree/model"), 4096)
    compatible_text = read_text(ctx.path("/proc/device-tree/compatible"), 4096)
    compatible = [c for c in (compatible_text or "").split("\0") if c.strip()]
    model = model.replace("\0", "").strip() if model else None
    want = [d for d in _compat(ctx).get("devices") or [] if isinstance(d, str)]
    measured = {"model": model, "compatible": compatible, "required": want}
    tegra = any("tegra" in c or c.startswith("nvidia,") for c in compatible) or "jetson" in (model or "").lower()
    if not tegra:
        seen = f"model {model!r}" if model else f"no {ctx.path('/proc/device-tree/model')}"
        if want:
            return Check("module", Verdict.FAIL, f"the installed bundle is for {', '.join(want)}, and this is not a "
                                                 f"Jetson ({seen})", REINSTALL, measured)
        return Check("module", Verdict.NA, f"not a Jetson: {seen}", measured=measured)
    if want and not set(want) & set(compatible):
        return Check("module", Verdict.FAIL, f"{model}: the installed bundle is for {', '.join(want)}, this module "
                                             f"is {', '.join(compatible)}", REINSTALL, measured)
    soc = next((c for c in compatible if "tegra" in c), compatible[-1] if compatible else "?")
    return Check("module", Verdict.PASS, f"{model or '(no model)'} ({soc})", measured=measured)


def check_nvpmodel(ctx: Context) -> Check:
    if not ctx.jetson:
        return Check("nvpmodel", Verdict.NA, "not a Jetson: no power modes")
    conf_path, status_path = ctx.path("/etc/nvpmodel.conf"), ctx.path("/var/lib/nvpmodel/status")
    conf, status = read_text(conf_path, 1 << 20), read_text(status_path, 4096)
    modes, default = parse_power_models(conf or "")
    measured: dict = {"modes": {str(k): v for k, v in modes.items()}, "default": default}
    if conf is None:
        return Check("nvpmodel", Verdict.WARN, f"no {conf_path}: the power modes are not installed",
                     "install nvpmodel (apt install nvidia-l4t-nvpmodel), then `sudo nvpmodel -q`", measured)
    m = re.search(r"pmode:\s*(\d+)", status or "")

    def name_of(i: int) -> str:
        return f"{i} ({modes.get(i, '?')})"

    if m is None:
        fix = f"sudo nvpmodel -m {default}" if default is not None else "sudo nvpmodel -m <mode>"
        return Check("nvpmodel", Verdict.WARN, f"no mode recorded in {status_path}: nvpmodel has not set one since "
                                               f"flashing", fix, measured)
    mode = int(m.group(1))
    measured.update(mode=mode, name=modes.get(mode), status=(status or "").strip())
    if modes and mode not in modes:
        known = ", ".join(map(name_of, modes))
        return Check("nvpmodel", Verdict.WARN, f"mode {mode} is not one of {conf_path}'s ({known})",
                     f"sudo nvpmodel -m {default if default is not None else '<mode>'}", measured)
    tail = "the default" if mode == default else f"default {name_of(default)}" if default is not None else "no default"
    return Check("nvpmodel", Verdict.PASS, f"mode {name_of(mode)}, {tail}", measured=measured)


def _read(path: str) -> str | None:
    return read_text(Path(path), 65536)


def _read_int(path: str) -> int | None:
    text = _read(path)
    try:
        return int(text.split()[0]) if text and text.split() else None
    except ValueError:
        return None


def _cpu_number(path: str) -> int:
    """N of a .../cpuN/cpufreq directory."""
    m = re.search(r"cpu(\d+)/cpufreq$", path)
    if m is None:  # the glob in _cpus also matches cpu0x/cpufreq, which sysfs never has
        raise ValueError(f"{path} is not a cpuN/cpufreq directory")
    return int(m.group(1))


def _cpus(ctx: Context) -> list[dict]:
    out = []
    for d in sorted(glob.glob(str(ctx.path("/sys/devices/system/cpu")) + "/cpu[0-9]*/cpufreq"), key=_cpu_number):
        gov = (_read(f"{d}/scaling_governor") or "").strip() or None
        out.append({"cpu": os.path.basename(os.path.dirname(d)), "governor": gov,
                    "min_khz": _read_int(f"{d}/scaling_min_freq"), "max_khz": _read_int(f"{d}/scaling_max_freq"),
                    "hw_max_khz": _read_int(f"{d}/cpuinfo_max_freq")})
    return out


def _gpu(ctx: Context) -> dict | None:
    for d in sorted(glob.glob(str(ctx.path("/sys/class/devfreq")) + "/*")):
        if _GPU_DEVFREQ.search(os.path.basename(d)):
            return {"devfreq": os.path.basename(d), "governor": (_read(f"{d}/governor") or "").strip() or None,
                    "min_hz": _read_int(f"{d}/min_freq"), "max_hz": _read_int(f"{d}/max_freq"),
                    "cur_hz": _read_int(f"{d}/cur_freq")}
    return None


def check_clocks(ctx: Context) -> Check:
    cpus = _cpus(ctx)
    governors = sorted({c["governor"] for c in cpus if c["governor"]})
    measured: dict = {"governors": governors, "cpus": cpus}
    if not ctx.jetson:
        return Check("clocks", Verdict.NA, "not a Jetson: jetson_clocks does not apply"
                     + (f" (CPU governor {', '.join(governors)})" if governors else ""), measured=measured)
    gpu = _gpu(ctx)
    online = (read_text(ctx.path("/sys/devices/system/cpu/online"), 256) or "").strip() or None
    measured.update(gpu=gpu, online=online)
    if not cpus:
        return Check("clocks", Verdict.WARN, f"no cpufreq under {ctx.path('/sys/devices/system/cpu')}: the clocks "
                                             f"cannot be read", "check that the L4T kernel is the one flashed "
                                                                "(cpufreq is built in)", measured)
    # jetson_clocks pins every CPU's and the GPU's minimum to its maximum
    pinned = all(c["min_khz"] and c["min_khz"] == c["hw_max_khz"] for c in cpus) and (
        gpu is None or (gpu["min_hz"] is not None and gpu["min_hz"] == gpu["max_hz"]))
    measured["jetson_clocks"] = pinned
    slow = [c["cpu"] for c in cpus if c["governor"] == "powersave"]
    gpu_text = f"GPU {gpu['governor']} ({gpu['devfreq']})" if gpu else "no GPU devfreq"
    text = (f"CPU governor {', '.join(governors) or '?'} on {len(cpus)} CPUs (online {online or '?'}), {gpu_text}; "
            f"jetson_clocks {'on: clocks pinned at their maximum' if pinned else 'off: clocks follow the load'}")
    if slow:
        return Check("clocks", Verdict.WARN, f"{text}; {', '.join(slow)} run the powersave governor (lowest clock): "
                                             f"boots and batches run slow", "sudo jetson_clocks (until the next boot), "
                                                                           "or set the governor to schedutil", measured)
    return Check("clocks", Verdict.PASS, text, measured=measured)


def _sees_cuda(name: str, probe: dict) -> bool:
    if name == "onnxruntime":
        return bool({"CUDAExecutionProvider", "TensorrtExecutionProvider"} & set(probe.get("providers") or []))
    return bool(probe.get("cuda"))


def _engine_text(name: str, probe: dict) -> str:
    if "missing" in probe:
        return f"{name} not installed"
    if "error" in probe:
        return f"{name}: {probe['error']}"
    if name == "onnxruntime":
        return f"onnxruntime {probe.get('version')} ({', '.join(probe.get('providers') or [])})"
    return f"torch {probe.get('version')} (CUDA {'available' if probe.get('cuda') else 'not available'})"


def _gpu_nodes(ctx: Context) -> list[str]:
    return [p for p in ("/dev/nvidia0", "/dev/nvhost-ctrl-gpu", "/dev/nvgpu/igpu0/ctrl", "/dev/nvmap")
            if os.path.exists(ctx.path(p))]


def check_cuda(ctx: Context) -> Check:
    if not ctx.system_root:
        return Check("cuda", Verdict.NA, ctx.not_here)
    engines = ctx.engines
    text = "; ".join(_engine_text(n, p) for n, p in engines.items())
    measured: dict = {"python": sys.executable, "engines": engines, "gpu_nodes": _gpu_nodes(ctx)}
    sees = [n for n, p in engines.items() if _sees_cuda(n, p)]
    b = ctx.usable_bundle
    device = b.meta.get("device") if b else None
    engine = b.meta.get("engine") if b else None
    runs_on = "torch" if engine == "torchscript" else engine
    measured.update(bundle_engine=engine, bundle_device=device)
    if b is not None and device not in (None, "cpu"):  # a CDI bundle: it is meant to use the GPU
        probe = engines.get(runs_on or "", {})
        if runs_on in sees:
            return Check("cuda", Verdict.PASS, f"the bundle's engine sees CUDA: {text}", measured=measured)
        if "missing" in probe or "error" in probe or runs_on not in engines:
            return Check("cuda", Verdict.WARN, f"the bundle runs {engine} on the GPU ({device}), and this Python "
                                               f"cannot tell whether it sees CUDA: {text}",
                         f"install {engine} in {measured['python']}'s environment to probe it "
                         f"(onnxruntime-gpu, or the JetPack torch wheel)", measured)
        return Check("cuda", Verdict.FAIL, f"the bundle runs {engine} on the GPU ({device}), and it sees no CUDA "
                                           f"here: {text}",
                     "install the CUDA build of the engine for this JetPack (onnxruntime-gpu with the CUDA provider, "
                     "or NVIDIA's torch wheel) and check the CDI spec (nvidia-ctk cdi list)", measured)
    gpu = ctx.jetson or bool(measured["gpu_nodes"])
    if not gpu:
        return Check("cuda", Verdict.NA, f"no NVIDIA GPU on this machine ({text})", measured=measured)
    if sees:
        return Check("cuda", Verdict.PASS, f"CUDA is visible to {', '.join(sees)}: {text}", measured=measured)
    if all("missing" in p for p in engines.values()):
        return Check("cuda", Verdict.NA, f"no engine installed in this Python ({measured['python']})",
                     measured=measured)
    return Check("cuda", Verdict.WARN, f"an NVIDIA GPU is here, and no installed engine sees CUDA: {text}",
                 "install onnxruntime-gpu (or NVIDIA's torch wheel for this JetPack) to run on the GPU; "
                 "a cpu bundle does not need it", measured)
