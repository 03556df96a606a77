"""Engine-flavoured log lines, one flushed write per line.

Owns the look of each simulated engine's log: vLLM's ``(APIServer pid=N)
INFO MM-DD HH:MM:SS [file.py:N]`` lines and uvicorn's ``INFO:     Application
startup complete.``, SGLang's ``[YYYY-MM-DD HH:MM:SS TP0]`` lines and ``The
server is fired up and ready to roll!``, raw NCCL ``host:pid:tid [0] NCCL
INFO`` lines (docs/reference/spark-facts.md §6), and the invented formats of ds41f and
TensorFold. Informational lines go to stdout, warnings and errors to stderr;
every line is flushed so a tail of the log file sees it at once.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from typing import TextIO


class EngineLog:
    def __init__(self, engine: str, rank: int, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.engine = engine
        self.rank = rank
        self.pid = os.getpid()
        self.host = socket.gethostname()
        self._out = out or sys.stdout
        self._err = err or sys.stderr

    # --- plumbing -------------------------------------------------------------
    def _write(self, stream: TextIO, line: str) -> None:
        try:
            stream.write(line + "\n")
            stream.flush()
        except (OSError, ValueError):  # closed pipe: logging must never kill the engine
            pass

    def raw(self, line: str, error: bool = False) -> None:
        self._write(self._err if error else self._out, line)

    # --- engine lines -----------------------------------------------------------
    def info(self, msg: str, src: str = "") -> None:
        self.raw(self._fmt("INFO", msg, src))

    def warn(self, msg: str, src: str = "") -> None:
        self.raw(self._fmt("WARNING", msg, src), error=True)

    def error(self, msg: str, src: str = "") -> None:
        self.raw(self._fmt("ERROR", msg, src), error=True)

    def _fmt(self, level: str, msg: str, src: str) -> str:
        now = time.time()
        if self.engine == "vllm":
            stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(now))
            where = f" [{src}]" if src else ""
            who = f"(APIServer pid={self.pid}) " if self.rank == 0 else ""
            return f"{who}{level} {stamp}{where} {msg}"
        if self.engine == "sglang":
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
            tag = f" TP{self.rank}" if src == "tp" else ""
            lvl = "" if level == "INFO" else f"{level} "
            return f"[{stamp}{tag}] {lvl}{msg}"
        if ".py" in src:  # vLLM-style source tags mean nothing for the other engines
            src = ""
        if self.engine == "ds41f":
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"
            return f"{stamp} {level:>5} ds41f::{src or 'serve'}: rank={self.rank} {msg}"
        # tensorfold (a Zig program: std.log style)
        stamp = time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1e3):03d}"
        lvl = {"INFO": "info", "WARNING": "warning", "ERROR": "error"}[level]
        return f"[{stamp}] {lvl}({src or 'serve'}): {msg}"

    def uvicorn(self, msg: str) -> None:
        """uvicorn-style lines of vLLM and SGLang (``INFO:     ...``)."""
        if self.engine == "vllm":
            self.raw(f"(APIServer pid={self.pid}) INFO:     {msg}")
        else:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            self.raw(f"[{stamp}] INFO:     {msg}")

    # --- NCCL -------------------------------------------------------------------
    def nccl(self, msg: str, warn: bool = False) -> None:
        tid = threading.get_native_id()
        kind = "WARN" if warn else "INFO"
        self.raw(f"{self.host}:{self.pid}:{tid} [0] NCCL {kind} {msg}", error=warn)
