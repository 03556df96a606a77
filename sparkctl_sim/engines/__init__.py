"""SIMULATED serving engines: ds41f, TensorFold, vLLM and SGLang stand-ins.

Each is a real process: it parses exactly the command line of
``docs/engines.md`` (refusing unknown flags), checks its rank, world size and
``NCCL_IB_HCA`` against the node, does a real TCP rendezvous with the other
ranks over the fabric, and (rank 0 only) serves an OpenAI-compatible HTTP API
whose timing comes from :mod:`sparkctl_sim.perfmodel`.

Modules:

* ``cli``        command lines and environment -> :class:`cli.EngineConfig` (pure)
* ``tokens``     the simulated tokenizer, chat template, prefix cache and text (pure)
* ``logs``       engine-flavoured log lines, flushed line by line
* ``rendezvous`` the torch.distributed-like TCP rendezvous and heartbeats
* ``server``     the aiohttp application and the token scheduler
* ``runtime``    process lifecycle: signals, node state bookkeeping, exit codes
* ``install``    writes the ``ds41f``/``tensorfold``/``vllm`` wrappers and the
  ``sglang`` package

One engine as a plain local process, for measuring the bench, is a test driver:
tests/localengine.py. Nothing here runs on real hardware.
"""
