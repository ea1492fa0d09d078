"""edge's build backend: setuptools', told which of edge's two installs it is building.

* A checkout's editable install (``pip install -e .``, the README's commands) is the build
  host: the ``edge`` package plus the build-host tools in ``image/`` and ``bench/`` and their
  console scripts (``edge-bundle``, ``edge-package``, ``edge-tokenizer``, ``edge-coldstart``).
  Those tools need the checkout anyway: a bundle is built from the checkout's commit.
* Every other build (a wheel, an sdist, ``pip install .``) is what a device or an app installs:
  the ``edge`` package and the device's console scripts only. ``image`` and ``bench`` are other
  projects' names on the package index, so installing edge must claim the name ``edge`` alone.

setup.py reads the choice from ``EDGE_BUILD_CHECKOUT`` and the two lists of console scripts from
``[tool.edge.scripts]`` in pyproject.toml. Each PEP 517/660 hook runs in a process of its own,
so the variable set for an editable hook never leaks into a wheel's build.
"""

from __future__ import annotations

import os

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403 (the backend is setuptools' own, hooks and all)

CHECKOUT_VARIABLE = "EDGE_BUILD_CHECKOUT"


def _as_checkout(hook):
    def run(*args, **kwargs):
        os.environ[CHECKOUT_VARIABLE] = "1"
        try:
            return hook(*args, **kwargs)
        finally:
            os.environ.pop(CHECKOUT_VARIABLE, None)

    run.__name__ = hook.__name__
    return run


get_requires_for_build_editable = _as_checkout(_setuptools.get_requires_for_build_editable)
prepare_metadata_for_build_editable = _as_checkout(_setuptools.prepare_metadata_for_build_editable)
build_editable = _as_checkout(_setuptools.build_editable)
