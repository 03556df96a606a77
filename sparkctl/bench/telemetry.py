"""The telemetry sampler of a bench run and its per-suite power summary.

Owns: :class:`TelemetrySampler` (calls the hook every ``interval_s`` while a
suite runs, plus once at its start and end, and keeps the rows of
``telemetry.csv``; a call that raises is counted and skipped) and
:func:`telemetry_summary` (mean and peak W per node and suite, energy and
J/token; pure). The hook's shape is documented in :mod:`sparkctl.bench.runner`.

Must not: reach a cluster itself (the hook is handed in) or print.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from sparkctl.bench.rows import utc

Telemetry = Callable[[], Awaitable[Mapping[str, Mapping[str, Any]]]]


class TelemetrySampler:
    """Samples the hook while a suite runs; keeps rows for telemetry.csv."""

    def __init__(self, hook: Telemetry | None, interval_s: float, t0: float) -> None:
        self.hook = hook
        self.interval_s = interval_s
        self.t0 = t0
        self.rows: list[dict[str, Any]] = []
        self.failures = 0
        self._suite = ""
        self._task: asyncio.Task[None] | None = None

    async def sample(self) -> None:
        if self.hook is None:
            return
        t = time.perf_counter()
        try:
            data = await self.hook()
        except Exception:  # noqa: BLE001 - a node that does not answer is a missing sample, not a failed run
            self.failures += 1
            return
        for node, d in sorted(data.items()):
            reasons = d.get("event_reasons")
            self.rows.append({
                "t_s": t - self.t0, "t_utc": utc(), "suite": self._suite, "node": node,
                "power_w": d.get("power_w"), "sm_mhz": d.get("sm_mhz"), "temp_c": d.get("temp_c"),
                "event_reasons": ";".join(map(str, reasons)) if isinstance(reasons, (list, tuple)) else reasons,
                "mem_available_gib": d.get("mem_available_gib"),
            })

    async def _loop(self) -> None:
        nxt = time.perf_counter()
        while True:
            nxt += self.interval_s
            await asyncio.sleep(max(0.0, nxt - time.perf_counter()))
            await self.sample()

    async def start(self, suite: str) -> None:
        self._suite = suite
        if self.hook is None:
            return
        await self.sample()
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
            await self.sample()


def telemetry_summary(rows: Sequence[Mapping[str, Any]], tokens_by_suite: Mapping[str, tuple[int, int]]
                      ) -> dict[str, Any]:
    """Mean and peak W per node and suite, energy (trapezoid over samples) and J/token. Pure.

    ``tokens_by_suite``: suite -> (completion tokens, uncached prompt tokens) the suite processed.
    """
    out: dict[str, Any] = {}
    for suite in dict.fromkeys(r["suite"] for r in rows):
        per_node: dict[str, Any] = {}
        energy = 0.0
        for node in sorted({r["node"] for r in rows if r["suite"] == suite}):
            pts = [(float(r["t_s"]), float(r["power_w"])) for r in rows
                   if r["suite"] == suite and r["node"] == node and r.get("power_w") not in (None, "")]
            if not pts:
                continue
            e = sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(pts, pts[1:]))
            energy += e
            per_node[node] = {"mean_w": sum(p for _, p in pts) / len(pts), "peak_w": max(p for _, p in pts),
                              "energy_j": e, "samples": len(pts)}
        comp, prompt = tokens_by_suite.get(suite, (0, 0))
        out[suite] = {
            "nodes": per_node, "energy_j": energy,
            "j_per_completion_token": energy / comp if comp and per_node else None,
            "j_per_token": energy / (comp + prompt) if (comp + prompt) and per_node else None,
        }
    return out
