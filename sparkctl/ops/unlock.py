"""``sparkctl unlock``: the locks a process that is gone left, removed by the plan
``sparkctl plan unlock`` prints (:func:`sparkctl.plan.lockplan.unlock_plan`), run by the plan interpreter."""

from __future__ import annotations

from collections.abc import Sequence

from sparkctl.model.inventory import Inventory
from sparkctl.ops.executor import Progress, TransportBackend, raise_failure, run_plan
from sparkctl.plan import lockplan
from sparkctl.transport import Transport


def break_locks(inv: Inventory, transport: Transport, say: Progress, nodes: Sequence[str] | None = None) -> str:
    """Remove the locks of ``nodes`` (every node's, every served name's claim when None) whoever holds
    them; returns the holders removed (the step's output)."""
    plan = lockplan.unlock_plan(inv, nodes)
    state = run_plan(plan, TransportBackend(inv, transport, say))
    if state.failed is not None:
        raise_failure(state, "unlock")
    return "".join(state.outputs.get(plan.steps[0].id, {}).values()).strip()
