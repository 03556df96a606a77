"""The part of a simulated image's file system that a container's Python sees: its torch and its libnccl.

SIMULATION ONLY. A real vLLM/SGLang image carries a pip torch and the NCCL that
torch loads. Two facts of a real image matter to sparkctl's nccl fact, and they
can disagree:

* the NCCL torch was compiled against: ``torch.cuda.nccl.version()`` is the
  ``NCCL_MAJOR``/``NCCL_MINOR``/``NCCL_PATCH`` macros of the nccl.h torch was
  built with (pytorch ``torch/csrc/cuda/nccl.cpp`` ``version()``), whatever
  library is loaded at run time;
* the NCCL the process loads: torch's wheel links ``libnccl.so.2`` from
  ``site-packages/nvidia/nccl/lib`` (torch/__init__.py preloads the CUDA deps
  from there). The community's sm_121 images build NCCL from source and point
  that ``libnccl.so.2`` at their build (eugr/spark-vllm-docker, as issue #18
  reports it; the pattern as public Dockerfiles write it: the source-built
  ``libnccl2`` deb installs ``/usr/lib/aarch64-linux-gnu/libnccl.so.2`` and the
  wheel's ``nvidia/nccl/lib/libnccl.so.2`` is replaced by a symlink to it). So
  torch says 2.27.x and the process runs 2.30.x, or the other way round.

Here an image's ``sparkctl_sim`` config section says both (``nccl``: the library,
``torch_nccl``: what torch was built against; ``sparkctl sim image load --nccl L
--torch-nccl T``). :func:`site_packages` lays out, once per image, under the sim
root's ``image-fs/<config digest>/``: ``site-packages/torch`` (the stub in
sparkctl_sim/containerpy/torch plus ``_sim_build.py`` with the compiled-in
version) and the library: a real ELF shared object built with the machine's C
compiler, exporting ``ncclGetVersion`` exactly as NCCL does (NVIDIA/nccl
``src/init.cc``: ``*version = NCCL_VERSION_CODE; return ncclSuccess;``, the code
from ``nccl.h.in`` ``NCCL_VERSION(X,Y,Z)``), so the dynamic loader really maps
it, ``/proc/self/maps`` really names it and ctypes really calls it. Built the way
torch was built (``nccl == torch_nccl``): the wheel's own file; otherwise the
community layout (the system library and the wheel's symlink to it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

DEFAULT_NCCL = "2.30.7"  # the simulated engines' default (sparkctl_sim/engines/runtime.py DEFAULT_IMAGE_NCCL)
STUB = Path(__file__).resolve().parent / "containerpy" / "torch" / "__init__.py"
NCCL_INVALID_ARGUMENT = 4  # nccl.h: ncclSuccess 0, ..., ncclInvalidArgument 4
LIB_DIR = "usr/lib/aarch64-linux-gnu"  # where the libnccl2 deb installs (the community layout's system library)


def version_code(version: str) -> int:
    """nccl.h.in ``NCCL_VERSION(X,Y,Z)``: X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z from 2.9."""
    x, y, z = (int(p) for p in version.split("."))
    return x * 1000 + y * 100 + z if (x <= 2 and y <= 8) else x * 10000 + y * 100 + z


def _atomic_dir(final: Path, build: Any) -> Path:
    if final.exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        build(tmp)
        os.rename(tmp, final)
    except OSError:
        if not final.exists():
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def libnccl(root: Path, version: str) -> Path:
    """``<root>/nccl-builds/<version>/libnccl.so.<version>``: built once per version."""
    def build(d: Path) -> None:
        src = d / "nccl.c"
        src.write_text(
            "/* SIMULATION: NCCL's version entry point (NVIDIA/nccl src/init.cc ncclGetVersion). */\n"
            f"int ncclGetVersion(int *version) {{ if (!version) return {NCCL_INVALID_ARGUMENT}; "
            f"*version = {version_code(version)}; return 0; }}\n")
        cc = shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            raise RuntimeError("sparkctl sim: the simulated libnccl is built with the machine's C compiler; "
                               "install gcc")
        subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", "-o", str(d / f"libnccl.so.{version}"),
                        str(src)], check=True, capture_output=True, timeout=120)
    return _atomic_dir(root / "nccl-builds" / version, build) / f"libnccl.so.{version}"


def site_packages(root: Path, image_id: str, sim: dict[str, Any], env: dict[str, str]) -> Path:
    """The image's site-packages (torch and the NCCL it loads), laid out once per image ID."""
    lib_v = str(sim.get("nccl") or env.get("NCCL_VERSION") or DEFAULT_NCCL).split("-")[0]
    torch_v = str(sim.get("torch_nccl") or lib_v)
    built = libnccl(root, lib_v)

    def build(d: Path) -> None:
        sp = d / "site-packages"
        (sp / "torch").mkdir(parents=True)
        shutil.copyfile(STUB, sp / "torch" / "__init__.py")
        (sp / "torch" / "_sim_build.py").write_text(
            "# SIMULATION: the nccl.h this torch was compiled with (torch/csrc/cuda/nccl.cpp version())\n"
            f"NCCL_COMPILED = ({', '.join(torch_v.split('.'))})\n")
        wheel = sp / "nvidia" / "nccl" / "lib"
        wheel.mkdir(parents=True)
        if torch_v == lib_v:  # the wheel's own library
            shutil.copyfile(built, wheel / "libnccl.so.2")
            return
        system = d / LIB_DIR
        system.mkdir(parents=True)
        shutil.copyfile(built, system / f"libnccl.so.{lib_v}")
        (system / "libnccl.so.2").symlink_to(f"libnccl.so.{lib_v}")
        # as `libs[0].symlink_to(system)` (relative: the directory is renamed into place)
        (wheel / "libnccl.so.2").symlink_to(f"../../../../{LIB_DIR}/libnccl.so.2")

    return _atomic_dir(root / "image-fs" / image_id.removeprefix("sha256:"), build) / "site-packages"
