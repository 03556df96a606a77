"""Active fabric probes: harmless traffic between the nodes' own fabric addresses.

Not read-only facts: don't-fragment pings of MTU-28 bytes on every twin, pings
to ring non-neighbours (through the relay), and optionally ib_write_bw per
twin. One script per node, all nodes at once: the b end of every twin starts
its ib_write_bw server, the a end waits a moment and runs the client.

What this module owns: :class:`FabricTarget`, the script
(:func:`build_fabric_script`, framed like the probe batch) and the pure
:func:`parse_fabric`. It must not run anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sparkctl.facts.batch import frame_parallel, split_batch
from sparkctl.facts.perftest import parse_ib_write_bw
from sparkctl.facts.registry import ProbeParseError, q


@dataclass(frozen=True)
class FabricTarget:
    kind: str  # df | relay | bw-server | bw-client
    netdev: str
    peer: str
    address: str  # the peer's address (df, relay, bw-client)
    rdma: str = ""
    port: int = 0


def build_fabric_script(targets: Sequence[FabricTarget], mtu: int, bandwidth_s: int = 0) -> str:
    """The pings run at once (a port that answers nothing costs its node one 2 s wait and one for
    the second try, not two per peer), then the ib_write_bw pairs one after another (two at once on one node would
    share its PCIe links and measure each other). A ping that gets no answer is sent once more
    before the pair counts as silent: one lost echo is a busy moment, not a broken path."""
    size = int(mtu) - 28
    pings: list[tuple[str, str]] = []
    steps: list[tuple[str, str]] = []
    for i, t in enumerate(targets):
        if t.kind == "df":
            once = f"ping -M do -s {size} -c 1 -W 2 -I {q(t.netdev)} {q(t.address)}"
            pings.append((f"fab{i}", f"have ping || exit 127; {once} || {once}"))
            continue
        if t.kind == "relay":
            once = f"ping -c 1 -W 2 {q(t.address)}"
            pings.append((f"fab{i}", f"have ping || exit 127; {once} || {once}"))
            continue
        if t.kind == "bw-server" and bandwidth_s:
            body = (f"have ib_write_bw || exit 127; (ib_write_bw -d {q(t.rdma)} -p {int(t.port)} -D {int(bandwidth_s)} "
                    "--report_gbits >/dev/null 2>&1 &) ; echo started")
        elif t.kind == "bw-client" and bandwidth_s:
            body = (f"have ib_write_bw || exit 127; sleep 1; ib_write_bw -d {q(t.rdma)} -p {int(t.port)} "
                    f"-D {int(bandwidth_s)} --report_gbits {q(t.address)}")
        else:
            continue
        steps.append((f"fab{i}", body))
    # the manifest names the batch, not its steps: parse_fabric goes by target index
    return frame_parallel(pings, then=steps, manifest="fabric")


def parse_fabric(targets: Sequence[FabricTarget], stdout: str) -> list[tuple[FabricTarget, bool | None, float | None]]:
    """Per target: (target, reached?, bandwidth Gb/s). None = not measured.

    A client whose report cannot be read (no result row, an unknown header) is
    "not reached", never a guessed bandwidth."""
    _, sections, _ = split_batch(stdout)
    out: list[tuple[FabricTarget, bool | None, float | None]] = []
    for i, t in enumerate(targets):
        sec = sections.get(f"fab{i}")
        if sec is None or sec.rc is None or sec.rc == 127:
            out.append((t, None, None))
        elif t.kind in ("df", "relay"):
            out.append((t, sec.rc == 0, None))
        elif t.kind == "bw-client":
            try:
                out.append((t, sec.rc == 0, parse_ib_write_bw(sec.text)))
            except ProbeParseError:
                out.append((t, False, None))
    return out
