"""SIMULATION: the sliver of PyTorch a simulated container image answers, for sparkctl's nccl fact.

Real: ``torch.cuda.nccl.version()`` returns the linked NCCL as a tuple, e.g.
(2, 30, 7) (torch/cuda/nccl.py: ``version()`` decodes ``torch._C._nccl_version()``),
and needs no GPU. Here the version is the image's NCCL_VERSION environment
variable (NVIDIA's CUDA/NGC images set ENV NCCL_VERSION; the simulated image
store writes it in the image config), else 2.30.7, the simulated engines'
default (sparkctl_sim/engines/runtime.py DEFAULT_IMAGE_NCCL). The docker shim
puts this directory on a container's PYTHONPATH (sparkctl_sim/dockershim.py):
the simulated image's site-packages.
"""

from __future__ import annotations

import os
import types

_DEFAULT = "2.30.7"


def _nccl_version() -> tuple[int, ...]:
    raw = os.environ.get("NCCL_VERSION", "").strip() or _DEFAULT
    try:
        return tuple(int(x) for x in raw.split("+")[0].split("."))
    except ValueError:
        return tuple(int(x) for x in _DEFAULT.split("."))


cuda = types.SimpleNamespace(nccl=types.SimpleNamespace(version=_nccl_version))
