"""The rootfs's fixed paths (image/bundle/layout.py): whatever the build host's interpreter and
environment, the runtime lands at /opt/edge, and copies name none of the host's directories."""

from __future__ import annotations

import os

from image.bundle.layout import PYTHON_HOME, SITE, Layout, _rewrite_binary, rewrite_host_paths
from image.bundle.rootfs import select_files
from image.bundle.trace import Trace


def _layout(exe: str, base: str, sites: list[str]) -> Layout:
    return Layout(exe, base, (3, 11), sites)


def test_a_pyenv_interpreter_in_the_home_moves_whole_to_the_fixed_prefix():
    base = "/home/builder/.pyenv/versions/3.11.7"
    lay = _layout(f"{base}/bin/python3.11", base, ["/tmp/w/site", "/srv/ci/.venv/lib/python3.11/site-packages"])
    assert lay.python == f"{PYTHON_HOME}/bin/python3.11"
    assert lay.container_path(f"{base}/bin/python3.11") == lay.python
    assert lay.container_path(f"{base}/lib/libpython3.11.so.1.0") == f"{PYTHON_HOME}/lib/libpython3.11.so.1.0"
    assert lay.container_path(f"{base}/lib/python3.11/os.py") == f"{PYTHON_HOME}/lib/python3.11/os.py"
    assert lay.container_path(f"{base}/lib/libtcl.so") == f"{PYTHON_HOME}/lib/libtcl.so"  # a prefix of its own
    assert lay.container_path("/tmp/w/site/edge/boot.py") == f"{SITE}/edge/boot.py"
    assert lay.container_path("/srv/ci/.venv/lib/python3.11/site-packages/zmq/__init__.py") == f"{SITE}/zmq/__init__.py"
    assert lay.container_path("/usr/lib/x86_64-linux-gnu/libc.so.6") == "/usr/lib/x86_64-linux-gnu/libc.so.6"


def test_a_distributions_interpreter_moves_only_its_own_files():
    lay = _layout("/usr/bin/python3.11", "/usr", ["/var/tmp/venv/lib/python3.11/site-packages"])
    assert lay.container_path("/usr/lib/python3.11/json/__init__.py") == f"{PYTHON_HOME}/lib/python3.11/json/__init__.py"
    assert lay.container_path("/usr/bin/python3.11") == f"{PYTHON_HOME}/bin/python3.11"
    assert lay.container_path("/usr/lib/x86_64-linux-gnu/libssl.so.3") == "/usr/lib/x86_64-linux-gnu/libssl.so.3"
    assert all(old not in (b"/usr", b"/", b"/usr/local") for old, _ in lay.replacements())


def test_binary_rewrites_keep_every_other_byte_where_it_was():
    old, new = b"/home/builder/.pyenv/versions/3.11.7", PYTHON_HOME.encode()
    # A linker merges string constants by their tails: PY_VERSION may point into the prefix's.
    data = b"\0" + old + b"\0" + old + b"/lib\0tail"
    got, n = _rewrite_binary(data, old, new)
    assert n == 2 and len(got) == len(data) and got.endswith(b"/lib\0tail")
    first, second = got[1:].split(b"\0")[:2]
    assert first.endswith(b"3.11.7") and os.path.normpath(first.decode()) == f"{PYTHON_HOME}/3.11.7"
    assert os.path.normpath(second.decode()) == f"{PYTHON_HOME}/lib"
    short = b"/o"  # no room: left as it was, never truncated
    assert _rewrite_binary(b"\0/o\0", short, PYTHON_HOME.encode()) == (b"\0/o\0", 0)


def test_text_files_are_rewritten_and_untouched_files_stay(tmp_path):
    text = tmp_path / "sysconfigdata.py"
    text.write_text("prefix = '/home/b/.pyenv/versions/3.11.7'\nlib = '/home/b/.pyenv/versions/3.11.7/lib'\n")
    other = tmp_path / "plain.py"
    other.write_text("x = 1\n")
    pairs = [(b"/home/b/.pyenv/versions/3.11.7", PYTHON_HOME.encode())]
    assert rewrite_host_paths(str(text), pairs) == 2 and rewrite_host_paths(str(other), pairs) == 0
    assert text.read_text() == f"prefix = '{PYTHON_HOME}'\nlib = '{PYTHON_HOME}/lib'\n"


def test_the_runtimes_files_are_kept_under_tmp_and_other_temporary_files_stay_out(tmp_path):
    assert str(tmp_path).startswith("/tmp/")  # pytest's: a temporary tree the rootfs leaves out
    site = tmp_path / "site"
    (site / "edge").mkdir(parents=True)
    code = site / "edge" / "__init__.py"
    code.write_text("")
    cached = site / "edge" / "__pycache__" / "__init__.cpython-311.pyc"
    cached.parent.mkdir()
    cached.write_bytes(b"")
    stray = tmp_path / "stray.txt"
    stray.write_text("")
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    t = Trace(executable="/usr/bin/python3.11", prefix=str(venv), base_prefix="/usr", sys_path=[], version=(3, 11, 7),
              module_files={"edge": [str(code), str(cached)]}, mapped=set(),
              opened={str(code), str(stray), str(venv / "pyvenv.cfg")}, dlopened=set(), executed=[])
    got = select_files(t, [], _layout("/usr/bin/python3.11", "/usr", [str(site)]))
    assert str(code) in got and str(stray) not in got and str(cached) not in got
    assert not any(p.endswith("pyvenv.cfg") for p in got)
