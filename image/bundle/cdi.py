"""Merge a CDI spec (Container Device Interface) into config.json: runc itself does not read CDI.

On a Jetson, ``nvidia-ctk cdi generate --mode=csv`` writes a spec (YAML or JSON) whose
container edits give the GPU's device nodes (``/dev/nvmap``, ``/dev/nvhost-*``,
``/dev/nvgpu/igpu0/*``), bind mounts of the host's CUDA/TensorRT libraries
(``/usr/lib/aarch64-linux-gnu/nvidia/...``), environment variables, createContainer hooks
(symlinks, ``ldcache``) and groups. We apply the top-level edits plus those of the chosen
devices (default: the device named ``all``, else every device).

A device node needs its type, major and minor in config.json. They are read from the
host with ``stat`` (the spec rarely carries them, and majors such as nvhost's are assigned
at boot). A node the build host lacks is *deferred*: left out of config.json, listed in
``edge-bundle.json``, and resolved on the device at start by ``edge-supervise`` (edge/supervise/bundle_start.py).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CdiEdits", "CdiError", "load_spec", "select_edits", "resolve_nodes", "merge", "mount_paths"]

DEFAULT_MOUNT_OPTIONS = ["ro", "nosuid", "nodev", "bind"]


class CdiError(ValueError):
    """A spec we cannot read or apply; the message names the file and the entry."""


@dataclass
class CdiEdits:
    kind: str = ""
    devices: list[str] = field(default_factory=list)  # CDI device names applied
    env: list[str] = field(default_factory=list)
    device_nodes: list[dict] = field(default_factory=list)
    mounts: list[dict] = field(default_factory=list)
    hooks: list[dict] = field(default_factory=list)
    additional_gids: list[int] = field(default_factory=list)


def load_spec(path: str | os.PathLike) -> dict:
    """A CDI spec from JSON or YAML (what nvidia-ctk writes), checked for the fields we use."""
    text = Path(path).read_text()
    try:
        spec = json.loads(text)
    except json.JSONDecodeError:
        try:
            import yaml
        except ImportError as exc:  # pragma: no cover - PyYAML is in the build extra
            raise CdiError(f"{path}: not JSON, and PyYAML is not installed to read YAML") from exc
        try:
            spec = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise CdiError(f"{path}: neither JSON nor YAML: {exc}") from exc
    if not isinstance(spec, dict) or "cdiVersion" not in spec or "kind" not in spec:
        raise CdiError(f"{path}: not a CDI spec (needs cdiVersion and kind)")
    if not isinstance(spec.get("devices"), list) or not spec["devices"]:
        raise CdiError(f"{path}: a CDI spec lists at least one device")
    return spec


def _gids(edits: dict) -> list[int]:
    return [int(g) for g in edits.get("additionalGids", edits.get("additionalGIDs", [])) or []]


def select_edits(spec: dict, devices: list[str] | None = None) -> CdiEdits:
    """Top-level container edits plus those of ``devices`` (default ``all``, else every device)."""
    by_name = {d["name"]: d for d in spec["devices"]}
    if devices is None:
        devices = ["all"] if "all" in by_name else list(by_name)
    missing = [d for d in devices if d not in by_name]
    if missing:
        raise CdiError(f"CDI spec {spec['kind']} has no device {', '.join(missing)}; it has {', '.join(by_name)}")
    out = CdiEdits(kind=spec["kind"], devices=list(devices))
    for edits in [spec.get("containerEdits") or {}] + [by_name[d].get("containerEdits") or {} for d in devices]:
        out.env.extend(edits.get("env") or [])
        out.device_nodes.extend(edits.get("deviceNodes") or [])
        out.mounts.extend(edits.get("mounts") or [])
        out.hooks.extend(edits.get("hooks") or [])
        out.additional_gids.extend(g for g in _gids(edits) if g not in out.additional_gids)
    seen: set[str] = set()
    out.device_nodes = [n for n in out.device_nodes if not (n["path"] in seen or seen.add(n["path"]))]
    return out


def resolve_nodes(nodes: list[dict]) -> tuple[list[dict], list[dict]]:
    """(OCI ``linux.devices`` entries read from the host, CDI nodes the host lacks)."""
    resolved, deferred = [], []
    for node in nodes:
        host = node.get("hostPath") or node["path"]
        try:
            st = os.stat(host)
        except FileNotFoundError:
            if node.get("major") is not None and node.get("minor") is not None and node.get("type"):
                st = None
            else:
                deferred.append(node)
                continue
        if st is not None and not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
            raise CdiError(f"CDI device node {host} is not a character or block device on this host")
        dev = {
            "path": node["path"],
            "type": node.get("type") or ("c" if stat.S_ISCHR(st.st_mode) else "b"),
            "major": os.major(st.st_rdev) if st is not None else int(node["major"]),
            "minor": os.minor(st.st_rdev) if st is not None else int(node["minor"]),
            "fileMode": int(node.get("fileMode", stat.S_IMODE(st.st_mode) if st is not None else 0o666)),
            "uid": int(node.get("uid", st.st_uid if st is not None else 0)),
            "gid": int(node.get("gid", st.st_gid if st is not None else 0)),
        }
        dev["_access"] = node.get("permissions") or "rwm"
        resolved.append(dev)
    return resolved, deferred


def mount_paths(edits: CdiEdits) -> list[str]:
    """Container paths the spec bind-mounts from the host: never copied into the rootfs."""
    return [m["containerPath"] for m in edits.mounts]


def merge(config: dict, edits: CdiEdits) -> list[dict]:
    """Apply ``edits`` to ``config`` in place; returns the deferred (unresolved) device nodes."""
    devices, deferred = resolve_nodes(edits.device_nodes)
    linux = config.setdefault("linux", {})
    rules = linux.setdefault("resources", {}).setdefault("devices", [{"allow": False, "access": "rwm"}])
    for dev in devices:
        rules.append({"allow": True, "type": dev["type"], "major": dev["major"], "minor": dev["minor"],
                      "access": dev.pop("_access")})
    linux.setdefault("devices", []).extend(devices)
    # A node the runtime's user could not open otherwise: join its group (video, render ...).
    group_gids = [d["gid"] for d in devices if d["gid"] != 0 and not d["fileMode"] & 0o006]
    for m in edits.mounts:
        config["mounts"].append({
            "destination": m["containerPath"], "type": m.get("type") or "bind",
            "source": m["hostPath"], "options": list(m.get("options") or DEFAULT_MOUNT_OPTIONS),
        })
    process = config["process"]
    env = {e.split("=", 1)[0]: e for e in process["env"]}
    for e in edits.env:
        env[e.split("=", 1)[0]] = e
    process["env"] = list(env.values())
    user = process["user"]
    gids = user.setdefault("additionalGids", [])
    for g in [*edits.additional_gids, *group_gids]:
        if g not in gids:
            gids.append(g)
    if not gids:
        del user["additionalGids"]
    for h in edits.hooks:
        entry = {"path": h["path"], "args": list(h.get("args") or [h["path"]])}
        if h.get("env"):
            entry["env"] = list(h["env"])
        if h.get("timeout"):
            entry["timeout"] = int(h["timeout"])
        config.setdefault("hooks", {}).setdefault(h["hookName"], []).append(entry)
    return deferred
