"""Pinned wheels: a Python package installed on a node that has no internet. Pure data and functions.

A node gets a package as one wheel file fetched on the operator's machine for the
node's platform (``pip download --only-binary :all: --platform ... --no-deps``,
``sparkctl.ops.wheelhouse.fetch_wheel``), verified against the SHA-256 pinned
here, pushed, verified again on the node and unpacked into a directory of its
own (a wheel is a zip archive laid out as site-packages, PEP 427; extracting
it is what ``pip install --target`` does for a wheel without scripts to
generate). The node needs neither pip nor the package index.

Platforms are named by the interpreter that will import the package (PEP 425
tags: the machine as ``platform.machine()`` reports it, the CPython version,
glibc for manylinux, PEP 600), never by ``uname``: the interpreter is what
loads the extension module.

What this module must not do: touch a file, a socket or a process.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

# The interpreter facts one command prints, one KEY=VALUE a line (parsed by parse_platform).
PLATFORM_COMMAND = (
    "python3 -c " + shlex.quote(
        "import os, platform, sys\n"
        "print('machine=' + platform.machine())\n"
        "print('python=%d.%d' % sys.version_info[:2])\n"
        "print('impl=' + sys.implementation.name)\n"
        "g = (os.confstr('CS_GNU_LIBC_VERSION') or '').split()\n"
        "print('glibc=' + (g[1] if len(g) == 2 else ''))\n"))


@dataclass(frozen=True)
class PinnedWheel:
    """One wheel file of one release, for one platform, with its SHA-256 as the index publishes it."""

    name: str  # distribution name, as pip takes it
    version: str
    filename: str  # the file on the index
    sha256: str
    size_bytes: int = 0
    machine: str = "any"  # platform.machine(): aarch64 | x86_64; "any": a pure-Python wheel
    pip_platform: str = "any"  # pip download --platform ("any": no platform flags)
    abi: str = "none"  # pip download --abi: abi3, cp312, ...
    python: str = ""  # "3.12": only this CPython (a cpXY-cpXY wheel); "" = any >= min_python (abi3)
    min_python: str = "3.9"
    min_glibc: str = "2.17"  # the manylinux tag's floor (PEP 600)
    unpacked_bytes: int = 0  # what it takes once extracted

    @property
    def spec(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class NodePlatform:
    machine: str
    python: str  # "3.12"
    impl: str  # cpython
    glibc: str  # "2.39", "" when not glibc

    def describe(self) -> str:
        return f"{self.impl} {self.python} on {self.machine}, glibc {self.glibc or 'none'}"


def parse_platform(text: str) -> NodePlatform | None:
    """The output of PLATFORM_COMMAND, None when it is not that (no python3 on the node)."""
    kv = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    if not kv.get("machine") or not kv.get("python"):
        return None
    return NodePlatform(kv["machine"], kv["python"], kv.get("impl", ""), kv.get("glibc", ""))


def _ver(v: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in v.split("."))
    except ValueError:
        return (0,)


def fits(pin: PinnedWheel, plat: NodePlatform) -> bool:
    if pin.machine == "any":  # pure Python (py3-none-any): any CPython new enough
        return _ver(plat.python) >= _ver(pin.min_python)
    if pin.machine != plat.machine or plat.impl != "cpython" or not plat.glibc:
        return False
    if _ver(plat.glibc) < _ver(pin.min_glibc):
        return False
    if pin.python:
        return pin.python == plat.python
    return _ver(plat.python) >= _ver(pin.min_python)


def select(pins: tuple[PinnedWheel, ...], plat: NodePlatform) -> PinnedWheel | None:
    """The pinned wheel this node's interpreter can load, None if none."""
    return next((p for p in pins if fits(p, plat)), None)


def platforms(pins: tuple[PinnedWheel, ...]) -> str:
    """What the pins cover, for a refusal's hint."""
    out = sorted({f"{p.machine} CPython {p.python or '>=' + p.min_python} glibc >= {p.min_glibc}" for p in pins})
    return "; ".join(out)


# --------------------------------------------------------------------------- the pins

# smg (Shepherd Model Gateway) 1.13.0, Apache-2.0: one abi3 extension (the Rust gateway) per
# machine. Hashes as the package index publishes them (https://pypi.org/simple/smg/, the
# JSON API's "hashes"); sparkctl refuses a download that does not match.
SMG = (
    PinnedWheel("smg", "1.13.0", "smg-1.13.0-cp38-abi3-manylinux_2_28_aarch64.whl",
                "5276328560354dca26ea9f454694c3d56994fb5a41c323c8edf97508181d2d7e", 39173600,
                "aarch64", "manylinux_2_28_aarch64", "abi3", min_glibc="2.28", unpacked_bytes=112_000_000),
    PinnedWheel("smg", "1.13.0", "smg-1.13.0-cp38-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
                "cfae8171dac68a74b4822263b1864fa79952992ee472a25ba7266ccd200399b4", 37437250,
                "x86_64", "manylinux2014_x86_64", "abi3", min_glibc="2.17", unpacked_bytes=108_000_000),
)

# setproctitle 1.3.7 (BSD-3-Clause): the one import of `smg launch` beyond the standard
# library and smg's own extension (smg/launch_router.py: `import setproctitle`; grpcio and
# pyyaml, also in smg's Requires-Dist, are imported by `smg serve` only). Per CPython version.
SETPROCTITLE = (
    PinnedWheel("setproctitle", "1.3.7",
                "setproctitle-1.3.7-cp312-cp312-manylinux2014_aarch64.manylinux_2_17_aarch64.manylinux_2_28_aarch64.whl",
                "6915964a6dda07920a1159321dcd6d94fc7fc526f815ca08a8063aeca3c204f1", 0,
                "aarch64", "manylinux2014_aarch64", "cp312", python="3.12", unpacked_bytes=100_000),
    PinnedWheel("setproctitle", "1.3.7",
                "setproctitle-1.3.7-cp312-cp312-manylinux1_x86_64.manylinux_2_28_x86_64.manylinux_2_5_x86_64.whl",
                "2906b6c7959cdb75f46159bf0acd8cc9906cf1361c9e1ded0d065fe8f9039629", 0,
                "x86_64", "manylinux_2_28_x86_64", "cp312", python="3.12", min_glibc="2.28", unpacked_bytes=100_000),
    PinnedWheel("setproctitle", "1.3.7",
                "setproctitle-1.3.7-cp311-cp311-manylinux1_x86_64.manylinux_2_28_x86_64.manylinux_2_5_x86_64.whl",
                "1607b963e7b53e24ec8a2cb4e0ab3ae591d7c6bf0a160feef0551da63452b37f", 0,
                "x86_64", "manylinux_2_28_x86_64", "cp311", python="3.11", min_glibc="2.28", unpacked_bytes=100_000),
)

# The node's exporter (sparkctl.node.exporter): prometheus/client_python 0.26.0 (Apache-2.0), pure
# Python, no dependencies. A py3-none-any wheel goes on PYTHONPATH as it is: Python imports from a
# zip archive (zipimport; a wheel is one, PEP 427), so nothing is installed into the node's Python.
PROMETHEUS_CLIENT = PinnedWheel(
    "prometheus_client", "0.26.0", "prometheus_client-0.26.0-py3-none-any.whl",
    "fa93d06737aa02bacd05794768508bb97d2fbee28cb3bca04eaae92f0ca953d6")
