"""The reference servers' command line: ``python -m sparkctl.bench.refserve [--lean] ...``.

Serves :class:`~sparkctl.bench.refserver.RefServer` (or, with ``--lean``,
:class:`~sparkctl.bench.leanserver.LeanRefServer`) on the host and port given,
prints ``refserver listening on URL`` once it listens (what
:class:`~sparkctl.bench.refserver.RefServerProcess` waits for), and stops on
SIGINT/SIGTERM. A module of its own so that neither server imports the other's.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence
from typing import Any

from sparkctl.bench.leanserver import LeanRefServer
from sparkctl.bench.refserver import FAULTS, RefConfig, RefServer


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    d = RefConfig()
    p = argparse.ArgumentParser(prog="python -m sparkctl.bench.refserve",
                                description="A reference OpenAI-compatible streaming server with KNOWN rates, for loopback.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 = a free port (printed on start)")
    p.add_argument("--model", default="refserver")
    p.add_argument("--ttft-base-s", type=float, default=d.ttft_base_s)
    p.add_argument("--ttft-per-token-s", type=float, default=d.ttft_per_token_s)
    p.add_argument("--gap-s", type=float, default=d.gap_s)
    p.add_argument("--tokens-per-chunk", type=int, default=d.tokens_per_chunk)
    p.add_argument("--role-chunk", action="store_true")
    p.add_argument("--no-usage", action="store_true")
    p.add_argument("--fault", choices=FAULTS, default=None)
    p.add_argument("--fault-after-tokens", type=int, default=d.fault_after_tokens)
    p.add_argument("--lean", action="store_true",
                   help="the lean server (sparkctl.bench.leanserver): same timing and bytes, no fault modes")
    return p.parse_args(argv)


async def _serve_forever(srv: Any) -> None:
    await srv.start()
    print(f"refserver listening on {srv.base_url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await srv.stop()


def main(argv: Sequence[str] | None = None) -> int:
    a = _parse(argv)
    # the waker thread must get the GIL back quickly when the loop thread is busy
    sys.setswitchinterval(0.0002)
    cfg = RefConfig(ttft_base_s=a.ttft_base_s, ttft_per_token_s=a.ttft_per_token_s, gap_s=a.gap_s,
                    tokens_per_chunk=a.tokens_per_chunk, role_chunk=a.role_chunk, usage=not a.no_usage,
                    fault=a.fault, fault_after_tokens=a.fault_after_tokens)
    if a.lean:
        asyncio.run(_serve_forever(LeanRefServer(cfg, host=a.host, port=a.port, model=a.model)))
    else:
        asyncio.run(_serve_forever(RefServer(cfg, host=a.host, port=a.port, model=a.model)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
