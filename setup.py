"""Which packages and console scripts a build of edge carries; pyproject.toml holds the rest.

build_backend.py sets EDGE_BUILD_CHECKOUT for a checkout's editable install (the build host:
edge, image/ and bench/, every console script); any other build is the device's install (edge
and the device's console scripts only). The script lists live in pyproject.toml's
[tool.edge.scripts], one copy for this file, the docs' test and the reader.
"""

import os
import sys
from pathlib import Path

from setuptools import find_packages, setup

if sys.version_info >= (3, 11):
    import tomllib
else:  # JetPack 6's Python 3.10: build-system.requires brings tomli
    import tomli as tomllib

HERE = Path(__file__).resolve().parent
SCRIPTS = tomllib.loads((HERE / "pyproject.toml").read_text())["tool"]["edge"]["scripts"]
CHECKOUT = os.environ.get("EDGE_BUILD_CHECKOUT") == "1"


def _console_scripts(table: dict) -> list[str]:
    return [f"{name} = {target}" for name, target in sorted(table.items())]


setup(
    packages=find_packages(include=["edge", "edge.*"] + (["image", "image.*", "bench", "bench.*"] if CHECKOUT else [])),
    entry_points={"console_scripts": _console_scripts(SCRIPTS["device"])
                  + (_console_scripts(SCRIPTS["build-host"]) if CHECKOUT else [])},
)
