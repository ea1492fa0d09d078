"""Metrics in a bundle: prometheus_client in the rootfs, the ``--metrics-dir`` bind mount and
environment (``oci_config.add_metrics_dir``), the directory edge-supervise makes, and the textfile
node_exporter reads on the host, written by the runtime under runc."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from edge.ipc.client import EdgeClient
from image.bundle import metrics, oci_config
from edge.supervise.bundle_start import prepare_host
from image.bundle.layout import PYTHON_HOME, SITE

from support.bundles import GID, UID, bundle_meta, private_bundle, runc_or_skip, start_container
from support.prometheus import promtool_check, samples, scrape_until, value

REQUESTS = [["hello world"], ["the quick brown fox", "jumps over the lazy dog"], ["edge runs on a Jetson"] * 3]


def _config() -> dict:
    return oci_config.runtime_config(args=["python"], env={"HOME": "/tmp"}, uid=UID, gid=GID,
                                     socket_dir_host="/run/edge", arch="x86_64", memory_bytes=1 << 30)


def test_add_metrics_dir_binds_the_host_dir_like_the_socket_dir_and_sets_the_textfile():
    config = _config()
    oci_config.add_metrics_dir(config, "/var/lib/node_exporter/edge")
    by_dest = {m["destination"]: m for m in config["mounts"]}
    mount = by_dest[oci_config.CONTAINER_METRICS_DIR]
    assert mount == {"destination": "/run/edge-metrics", "type": "bind", "source": "/var/lib/node_exporter/edge",
                     "options": ["rbind", "rw", "nosuid", "nodev", "noexec"]}
    assert mount["options"] == by_dest[oci_config.CONTAINER_SOCKET_DIR]["options"]
    assert "EDGE_METRICS_TEXTFILE=/run/edge-metrics" in config["process"]["env"]
    assert oci_config.CONTAINER_METRICS_DIR in oci_config.MOUNTPOINTS  # made in every rootfs: runc never writes there


def test_without_a_metrics_dir_the_config_is_unchanged():
    config = _config()
    oci_config.add_metrics_dir(config, None)
    assert config == _config()
    assert metrics.metadata(None, None) == {"metrics": None, "metrics_dir": None}
    assert metrics.metadata("0.26.0", "/m") == {"metrics": {"prometheus_client": "0.26.0"}, "metrics_dir": "/m"}


def test_prometheus_client_is_looked_up_on_the_runtimes_module_path(tmp_path):
    import prometheus_client  # noqa: F401 - the dev environment has the metrics extra
    from importlib.metadata import version

    from edge.runtime.launch import boot_pythonpath

    env = {"PYTHONPATH": os.pathsep.join(boot_pythonpath())}
    assert metrics.prometheus_client_version(sys.executable, env) == version("prometheus_client")
    assert metrics.prometheus_client_version(sys.executable, {"PYTHONPATH": ""}) is None  # -S: no site-packages
    assert metrics.trace_args(tmp_path, None) == []
    assert metrics.trace_args(tmp_path, "0.26.0") == ["--metrics-textfile", str(tmp_path / "metrics")]
    assert (tmp_path / "metrics").is_dir()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to the runtime's user needs root")
def test_supervisor_makes_the_metrics_dir_for_the_runtime_readable_by_all(tmp_path):
    meta = {"socket_dir": str(tmp_path / "run"), "metrics_dir": str(tmp_path / "metrics" / "edge"),
            "user": {"uid": UID, "gid": GID}}
    prepare_host(meta)
    st = os.stat(meta["metrics_dir"])
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (UID, GID, 0o755)
    assert stat.S_IMODE(os.stat(meta["socket_dir"]).st_mode) == 0o750
    prepare_host({**meta, "metrics_dir": None, "socket_dir": str(tmp_path / "run2")})  # older bundles
    assert not (tmp_path / "run2" / "metrics").exists() and (tmp_path / "run2").is_dir()


def test_rootfs_carries_prometheus_client_and_what_it_imports(ort_bundle):
    import prometheus_client
    from importlib.metadata import version

    meta = bundle_meta(ort_bundle)
    assert meta["metrics"] == {"prometheus_client": version("prometheus_client")}
    assert meta["metrics_dir"] is None
    rootfs = ort_bundle / "rootfs"
    pkg = Path(prometheus_client.__file__).parent
    site = rootfs / SITE.lstrip("/") / "prometheus_client"  # image/bundle/layout.py: the fixed site directory
    for f in pkg.rglob("*.py"):  # wholesale, like the edge package: lazily imported modules too
        assert (site / f.relative_to(pkg)).is_file(), f

    stdlib = rootfs / PYTHON_HOME.lstrip("/") / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    assert (stdlib / "http" / "server.py").is_file()
    assert (rootfs / oci_config.CONTAINER_METRICS_DIR.lstrip("/")).is_dir()


def test_textfile_in_the_metrics_dir_counts_what_was_sent(ort_bundle, tmp_path):
    runc_or_skip()
    bundle = private_bundle(ort_bundle, tmp_path)
    host_dir = tmp_path / "prom"
    config = json.loads((bundle / "config.json").read_text())
    oci_config.add_metrics_dir(config, str(host_dir))  # what edge-bundle build --metrics-dir writes
    config["process"]["env"].append("EDGE_METRICS_INTERVAL_S=0.2")  # not the default 15 s: the test polls
    (bundle / "config.json").write_text(json.dumps(config))
    meta = bundle_meta(bundle)
    meta["metrics_dir"] = str(host_dir)
    (bundle / "edge-bundle.json").write_text(json.dumps(meta))
    prepare_host(meta)  # the socket and metrics directories, as on the device
    textfile = host_dir / "edge.prom"
    container = start_container(bundle, tmp_path / "runc")
    try:
        container.wait_ready()
        with EdgeClient(meta["address"], timeout_s=60) as client:
            for texts in REQUESTS:
                client.embed(texts)
        found = scrape_until(lambda: textfile.read_bytes() if textfile.exists() else b"",
                             lambda s: ("edge_requests_total", (("type", "infer"),)) in s
                             and value(s, "edge_requests_total", type="infer") >= len(REQUESTS), timeout_s=30)
        assert value(found, "edge_requests_total", type="infer") == len(REQUESTS), container.output(tail=4000)
    finally:
        container.stop()
    data = textfile.read_bytes()  # the last write, at shutdown
    assert value(samples(data), "edge_requests_total", type="infer") == len(REQUESTS)
    st = textfile.stat()
    assert st.st_uid == UID and stat.S_IMODE(st.st_mode) & 0o004  # node_exporter (another user) reads it
    promtool_check(data)
