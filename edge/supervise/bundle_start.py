"""What a start needs of the bundle on this host: its host directories made the runtime's, and the
config.json runc starts it with: the bundle's own, or a runtime copy (in the work directory; the
bundle, signed, stays as it is) with the CDI devices the build host lacked and an RLIMIT_NOFILE this
process can grant."""

import json
import os
import resource
import sys

from edge.supervise.logs import log
from edge.system.socket_dir import SocketDirError, ipc_socket_name, prepare_host_dirs, prepare_socket_dir


def prepare_host(meta):
    """The socket directory, the state directory (the request journal) and, with ``edge-bundle build
    --metrics-dir``, the metrics directory, made the runtime's (edge/system/socket_dir.py
    ``prepare_socket_dir``: its stale leftovers removed). A directory it refuses ends the start with
    one log line and the message (exit 1), not a traceback: systemd shows both, and no restart can
    fix it."""
    uid, gid = meta["user"]["uid"], meta["user"]["gid"]
    try:
        # socket: the runtime's user and its group (the host apps) only; metrics: node_exporter reads it
        done = prepare_socket_dir(meta["socket_dir"], uid, gid, socket_name=ipc_socket_name(meta.get("address")))
        if done["created"] or done["chowned_from"] or done["chmodded_from"] or done["removed"] or done["live"]:
            log("supervise.socket_dir", **done)
        prepare_host_dirs(uid, gid, meta.get("metrics_dir"), meta.get("state_dir"))
    except SocketDirError as exc:
        log("supervise.socket_dir_refused", path=exc.path, reason=exc.reason, error=str(exc))
        sys.exit(f"edge-supervise: {exc}")


def absolute_paths(config, bundle):
    """root.path and the binds that name a path relative to the bundle (its under-tmp copies)."""
    bundle = os.path.realpath(bundle)
    config["root"]["path"] = os.path.realpath(os.path.join(bundle, config["root"]["path"]))
    for m in config.get("mounts", []):
        if m.get("type") == "bind" and not os.path.isabs(m["source"]):
            m["source"] = os.path.realpath(os.path.join(bundle, m["source"]))
    return config


def config_nofile(config):
    """The RLIMIT_NOFILE entry of a config.json's ``process.rlimits`` (a dict: type, hard, soft), or None."""
    for r in (config.get("process") or {}).get("rlimits") or []:
        if r.get("type") == "RLIMIT_NOFILE":
            return r
    return None


def nofile_grant(wanted):
    """The largest hard RLIMIT_NOFILE up to ``wanted`` that runc, our child, can set: runc's init
    sets the config's limits with setrlimit, and a hard limit above the one it inherits needs
    CAP_SYS_RESOURCE (and at most fs.nr_open). Tried on ourselves, then put back: raising the soft
    limit to the hard one is always allowed, so only the hard limit can be out of reach."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or wanted <= hard:
        return wanted
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, wanted))
    except (OSError, ValueError):  # EPERM: no CAP_SYS_RESOURCE (or above fs.nr_open)
        return hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))  # lowering: always allowed
    return wanted


def _has_cap_sys_resource():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> 24 & 1)  # CAP_SYS_RESOURCE = 24
    except (OSError, ValueError):
        pass
    return False


def nofile_cap(bundle, hard=None):
    """The hard RLIMIT_NOFILE to start the bundle's container with when this process cannot grant
    the one its config.json asks for (None: its own). runc would otherwise fail with "error
    setting rlimit type 7: operation not permitted", on every restart. Logs a warning naming the
    setting that raises it. ``hard``: the hard limit of the process that will start it, when it
    is not this one (``--stage-snapshot --nofile-limit``: the unit's LimitNOFILE=), so that a
    snapshot taken here has the limit the unit's start will compare it with."""
    with open(os.path.join(bundle, "config.json")) as f:
        entry = config_nofile(json.load(f))
    if entry is None:
        return None
    wanted = max(int(entry.get("hard", 0)), int(entry.get("soft", 0)))
    if hard is None:
        granted = nofile_grant(wanted)
    else:  # what nofile_grant would find in that process: above its hard limit only with CAP_SYS_RESOURCE
        granted = wanted if wanted <= hard or _has_cap_sys_resource() else hard
    if granted >= wanted:
        return None
    log("supervise.nofile_capped", wanted=wanted, granted=granted, setting="LimitNOFILE=",
         warning=f"bundle asks NOFILE {wanted}, this process may grant {granted} at most (no CAP_SYS_RESOURCE "
                 f"to raise its hard limit); starting with {granted}; raise it with LimitNOFILE= in edge.service")
    return granted


def runtime_bundle(bundle, meta, workdir, nofile=None):
    """``bundle``, or a copy of its config in ``workdir`` (paths made absolute; the bundle, signed,
    stays as it is) with the CDI devices the build host lacked, read here, and with ``nofile``
    (:func:`nofile_cap`) its RLIMIT_NOFILE capped at that."""
    deferred = ((meta.get("cdi") or {}).get("deferred_devices")) or []
    if not deferred and nofile is None:
        return bundle
    with open(os.path.join(bundle, "config.json")) as f:
        config = json.load(f)
    entry = config_nofile(config)
    if nofile is not None and entry is not None:
        entry["hard"] = min(entry["hard"], nofile)
        entry["soft"] = min(entry["soft"], entry["hard"])
    rules = config["linux"]["resources"]["devices"]
    gids = config["process"]["user"].setdefault("additionalGids", [])
    for node in deferred:
        st = os.stat(node.get("hostPath") or node["path"])  # missing on this device: fail, naming it
        kind = "b" if (st.st_mode & 0o170000) == 0o060000 else "c"
        config["linux"].setdefault("devices", []).append({
            "path": node["path"], "type": kind, "major": os.major(st.st_rdev), "minor": os.minor(st.st_rdev),
            "fileMode": st.st_mode & 0o777, "uid": st.st_uid, "gid": st.st_gid})
        rules.append({"allow": True, "type": kind, "major": os.major(st.st_rdev), "minor": os.minor(st.st_rdev),
                      "access": node.get("permissions") or "rwm"})
        if st.st_gid and not st.st_mode & 0o006 and st.st_gid not in gids:
            gids.append(st.st_gid)
    with open(os.path.join(workdir, "config.json"), "w") as f:
        json.dump(absolute_paths(config, bundle), f)
    return workdir



def nofile_differs(snap, run_bundle):
    """Why the snapshot's RLIMIT_NOFILE is not the one a fresh start gets now (None: it is): one
    taken while it was capped (``supervise.nofile_capped``) would keep the cap after LimitNOFILE=
    was raised, and one taken with more than this process may grant cannot be restored."""
    with open(os.path.join(snap, "config.json")) as f:
        theirs = config_nofile(json.load(f))
    with open(os.path.join(run_bundle, "config.json")) as f:
        ours = config_nofile(json.load(f))
    theirs, ours = (theirs or {}).get("hard"), (ours or {}).get("hard")
    return None if theirs == ours else f"taken with RLIMIT_NOFILE {theirs}, this start's is {ours}"
