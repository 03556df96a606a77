"""Print the bench client's own capacity: events/s at concurrency 64 and event-loop lag.

The reference server runs in a child process and offers far more events than
one Python event loop can take, so the figures are the client's ceiling on
this machine. Prints figures; asserts nothing.

    python bench/client_capacity.py [--concurrency 64] [--max-tokens 256] [--gap-s 0.0005]
"""

from __future__ import annotations

import argparse
import asyncio

from sparkctl.bench.refserver import RefServerProcess
from sparkctl.bench.selftest import measure_client_capacity


async def _main(a: argparse.Namespace) -> None:
    async with RefServerProcess() as srv:
        k = await measure_client_capacity(srv.base_url, concurrency=a.concurrency, max_tokens=a.max_tokens,
                                          gap_s=a.gap_s)
    offered = f"{k.offered_events_per_s:,.0f}/s" if k.offered_events_per_s else "unpaced"
    print(f"concurrency          {k.concurrency}")
    print(f"events               {k.n_events} in {k.window_s:.3f} s (offered {offered})")
    print(f"client events/s      {k.events_per_s:,.0f}")
    print(f"loop lag p50/p99/max {k.loop_lag_p50_ms:.2f} / {k.loop_lag_p99_ms:.2f} / {k.loop_lag_max_ms:.2f} ms")
    print(f"statuses             {dict(k.statuses)}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--gap-s", type=float, default=0.0005)
    asyncio.run(_main(p.parse_args()))
