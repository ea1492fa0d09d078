"""Which of the environment's directories the bundle keeps although they lie in a temporary tree
that the rootfs otherwise leaves out (image/bundle/rootfs.py: tmp_roots, kept_roots)."""

from __future__ import annotations

from image.bundle.rootfs import kept_roots, select_files, tmp_roots
from image.bundle.trace import Trace


def _trace(prefix: str, base: str, checkout: str) -> Trace:
    return Trace(executable=f"{prefix}/bin/python", prefix=prefix, base_prefix=base, sys_path=[], version=(3, 11, 7),
                 module_files={"edge": [f"{checkout}/edge/__init__.py"]}, mapped=set(), opened=set(), dlopened=set(),
                 executed=[])


def test_a_checkout_under_tmp_is_kept_and_bound_back_over_the_tmpfs():
    t = _trace("/tmp/ci/.venv", "/usr/local", "/tmp/ci")
    assert tmp_roots(t) == ["/tmp/ci"]  # the outermost: the venv lies inside the checkout
    assert kept_roots(t) == ["/tmp/ci"]


def test_a_checkout_under_var_tmp_is_kept_without_a_bind():
    t = _trace("/var/tmp/ci/.venv", "/usr/local", "/var/tmp/ci")
    assert tmp_roots(t) == []  # the container mounts nothing on /var/tmp
    assert kept_roots(t) == ["/var/tmp/ci"]


def test_a_checkout_elsewhere_keeps_nothing_extra():
    t = _trace("/srv/edge/.venv", "/usr/local", "/srv/edge")
    assert tmp_roots(t) == [] and kept_roots(t) == []


def test_the_kept_roots_let_their_files_through_and_other_temporary_files_stay_out(tmp_path):
    assert str(tmp_path).startswith("/tmp/")  # pytest's: a temporary tree the rootfs leaves out
    env = tmp_path / "ci"
    (env / "edge").mkdir(parents=True)
    code = env / "edge" / "__init__.py"
    code.write_text("")
    stray = tmp_path / "stray.txt"
    stray.write_text("")
    t = _trace(str(env / ".venv"), "/usr/local", str(env))
    t.opened = {str(code), str(stray)}
    got = select_files(t, [], kept_roots(t))
    assert str(code) in got and str(stray) not in got
