"""The live stacks of a cluster, read from their run records: what a gateway registers. Read-only.

:func:`live_stacks` is the one reader for consumers of several stacks (the
gateway, ``status``): one round trip to the state node (the inventory's first
node) for every stack's record, then :func:`sparkctl.model.stacks.live_from_records`
(pure) for the served name, the nodes and each head's endpoint.
"""

from __future__ import annotations

from sparkctl.model.inventory import Inventory
from sparkctl.model.stacks import LiveStack, live_from_records
from sparkctl.ops.lock import read_records
from sparkctl.transport import Transport

__all__ = ["LiveStack", "live_stacks"]


def live_stacks(inv: Inventory, transport: Transport, *, serving_only: bool = False) -> tuple[LiveStack, ...]:
    """Every live stack (its record says starting, serving, stopping or switching), by stack name.

    Each item names its stack, profile, state, ``served_name``, model
    (``<model.id>@<revision>``), engine, nodes (heads first) and one
    :class:`~sparkctl.model.stacks.HeadEndpoint` per replica head: the port, the
    address the engine binds (``listen``), what a client on the head itself asks
    (``on_node_host``) and the operator's route (``route.url``, ``route.via``).
    ``serving_only``: only stacks whose record says "serving" (the backends a
    gateway routes requests to). Records are the truth here, not probes: a stack
    whose engine died still shows until ``status`` reports the drift or a
    ``down`` records it stopped.
    """
    return live_from_records(read_records(inv, transport), inv, serving_only=serving_only)
