"""Python wheels sparkctl pushes to nodes, pinned by version and SHA-256. Pure data.

A node may have no route to the internet: a wheel is fetched on the operator's machine
(:func:`sparkctl.ops.wheelhouse.fetch_wheel`, with pip), checked against the pin here, and
pushed by a plan's ``put`` step beside the code that imports it. A pure-Python wheel
(platform tag ``any``) goes on ``PYTHONPATH`` as it is: Python imports from a zip archive
(zipimport; a wheel is one, PEP 427), so nothing is installed into the node's Python.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PinnedWheel:
    name: str  # the distribution's name as pip spells it
    version: str
    filename: str  # the wheel file, as PyPI serves it (PEP 427 name)
    sha256: str  # of that file, as PyPI lists it
    platform: str = "any"  # the wheel's platform tag: "any" goes on PYTHONPATH as it is

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


# The node's exporter (sparkctl.node.exporter): prometheus/client_python, pure Python, no dependencies.
PROMETHEUS_CLIENT = PinnedWheel(
    "prometheus_client", "0.26.0", "prometheus_client-0.26.0-py3-none-any.whl",
    "fa93d06737aa02bacd05794768508bb97d2fbee28cb3bca04eaae92f0ca953d6")
