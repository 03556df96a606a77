"""SIMULATION: the sliver of PyTorch a simulated container image answers, for sparkctl's nccl fact.

Real: ``torch.cuda.nccl.version()`` returns the NCCL torch was compiled against as a
tuple, e.g. (2, 30, 7) (torch/cuda/nccl.py ``version()`` decodes
``torch._C._nccl_version()``, the nccl.h macros: pytorch torch/csrc/cuda/nccl.cpp),
and needs no GPU; ``import torch`` maps the NCCL library torch links into the
process (torch/__init__.py preloads the CUDA libraries of ``site-packages/nvidia``;
libtorch_cuda.so needs ``libnccl.so.2``). Here the image's simulated site-packages
(sparkctl_sim/imagefs.py) hold this file, ``_sim_build.py`` with the compiled-in
version, and ``nvidia/nccl/lib/libnccl.so.2``, a real shared object that the import
loads with the dynamic loader, as the real one does.
"""

from __future__ import annotations

import ctypes
import os
import types

try:
    from torch._sim_build import NCCL_COMPILED
except ImportError:  # outside a simulated image (a bare PYTHONPATH): the simulated engines' default
    NCCL_COMPILED = (2, 30, 7)

_LIB = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "nvidia", "nccl", "lib", "libnccl.so.2")
if os.path.exists(_LIB):
    ctypes.CDLL(_LIB, mode=ctypes.RTLD_GLOBAL)


def _nccl_version() -> tuple[int, ...]:
    return tuple(NCCL_COMPILED)


cuda = types.SimpleNamespace(nccl=types.SimpleNamespace(version=_nccl_version))
