"""Entry point of the SIMULATED engines: ``python3 -m sparkctl_sim.engine ENGINE ARGS...``.

ENGINE is one of ds41f, tensorfold, vllm, sglang; ARGS are exactly the command
line of docs/engines.md after the program name (``serve ...`` for ds41f,
tensorfold and vllm; the ``launch_server`` flags for SGLang). The work lives
in :mod:`sparkctl_sim.engines`; this module only re-exports the public entry
points:

* :func:`main` -- run one engine process, returns its exit code;
* :func:`install_engines` -- write the ``ds41f``/``tensorfold``/``vllm``
  wrappers and the ``sglang`` package.

Nothing here runs on real hardware.
"""

from __future__ import annotations

import sys

from sparkctl_sim.engines.install import install_engines
from sparkctl_sim.engines.runtime import main

__all__ = ["install_engines", "main"]

if __name__ == "__main__":
    sys.exit(main())
