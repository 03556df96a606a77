"""A node's facts as the exporter reads them: the rendered probe script, run and parsed.

:class:`NodeReader` runs the script the operator rendered into the exporter's configuration
(:func:`sparkctl.facts.batch.fact_script`) and parses it with
:func:`sparkctl.facts.batch.parse_batch`, one probe at a time; :func:`node_document` is the
node's ``status`` row (:func:`sparkctl.facts.statusrow.node_row`) as ``/node.json`` serves it.
"""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any

from sparkctl.facts.batch import parse_batch, split_batch
from sparkctl.facts.nodefacts import NodeFacts
from sparkctl.facts.statusrow import node_row
from sparkctl.facts.watchdog import KILLS

PROBE_TIMEOUT_S = 20
REUSE_S = 5.0  # a probe younger than this answers /node.json too (the page samples every 5 s)


@dataclass(frozen=True)
class Reading:
    facts: NodeFacts
    kills: int | None
    seconds: float
    at: float  # time.time() when it was read


class NodeReader:
    """Runs the rendered probe script and parses it (one probe at a time)."""

    def __init__(self, node: str, script: str) -> None:
        self.node, self.script = node, script
        self._lock = threading.Lock()
        self._last: Reading | None = None

    def read(self, max_age_s: float = 0.0) -> Reading:
        with self._lock:
            if self._last is not None and max_age_s and time.time() - self._last.at < max_age_s:
                return self._last
            t0 = time.perf_counter()
            try:
                out = subprocess.run(["/bin/sh", "-c", self.script], capture_output=True, text=True,
                                     timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL).stdout
            except subprocess.TimeoutExpired as exc:
                out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            facts = parse_batch(self.node, out)
            _, sections, _ = split_batch(out)
            k = sections.get(KILLS.key)
            kills = None
            if k is not None and k.rc == 0:
                try:
                    kills = KILLS.parse(k.text)
                except Exception:  # noqa: BLE001 - a count we cannot read is absent, like any fact
                    kills = None
            self._last = Reading(facts, kills, time.perf_counter() - t0, time.time())
            return self._last



def node_document(node: str, r: Reading) -> dict[str, Any]:
    """``/node.json``: the node's status row, and what the head's page plots."""
    f = r.facts
    return {"node": node, "at": r.at, "row": node_row(f), "mem_total_kib": f.mem_total_kib,
            "mem_free_kib": f.mem_free_kib, "mem_cached_kib": f.mem_cached_kib, "unreadable": dict(f.unreadable),
            "engine_unit": ({"result": f.engine_unit.result, "restarts": f.engine_unit.n_restarts}
                            if f.engine_unit else None)}
