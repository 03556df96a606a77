"""Bench-time sampling of every node through the transport (the edge for bench).

``sampler`` returns the async callable the bench runner polls at >= 1 Hz; each
call is one fan-out of a cheap read-only command over the reused connections.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from sparkctl.facts.gpu import parse_telemetry, telemetry_command
from sparkctl.model.inventory import Inventory
from sparkctl.transport import Transport


def sampler(inv: Inventory, transport: Transport, nodes: Sequence[str]
            ) -> Callable[[], Awaitable[Mapping[str, Mapping[str, Any]]]]:
    cmds = {n: telemetry_command(inv.node(n)) for n in nodes}

    async def sample() -> Mapping[str, Mapping[str, Any]]:
        res = await asyncio.to_thread(transport.run_all, cmds, timeout_s=5.0)
        return {n: parse_telemetry(r.stdout) if r.ok else {} for n, r in res.items()}

    return sample
