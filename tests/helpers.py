"""Helpers shared by the unit tests (tests/*.py); the SIMULATED cluster's are in tests/sim/helpers.py.

Test modules import these (``from helpers import ...``) rather than each other:

* a healthy ring for the laws: the repo's ring inventory (``INV``), the bundled
  ds41f profile (``DS``), one node's facts as a good box gives them (``healthy``),
  the laws' context over them (``ctx``);
* the inventory each bundled profile renders against (``INVENTORY_FOR``);
* a local hub's repository and sparkctl's fetch from it (``FILES``, ``fetch``, ``tree``);
* a plan run with no hosts (``StubBackend``: every command succeeds; ``FailsAt``: the probes of
  the phases and addresses a test names fail), for planrun's branches.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from sparkctl.facts.nodefacts import GpuFacts, LinkFacts, NodeFacts
from sparkctl.model.inventory import Inventory, load_inventory, loads_inventory
from sparkctl.model.profiles import resolve
from sparkctl.model.resources import Roots
from sparkctl.ops.hubfetch import fetch_model
from sparkctl.ops.hubfetch import resolve as resolve_fetch
from sparkctl.plan import laws
from sparkctl.transport import LocalTransport
from sparkctl_sim.hub import LocalHub

REPO = Path(__file__).resolve().parent.parent

# --------------------------------------------------------------------------- a healthy ring for the laws

INV = load_inventory(REPO / "inventory.yaml")
DS = resolve("ds41f-tp4-ring", Roots.make(env={})).profile
HELD = ["linux-nvidia-hwe-24.04", "linux-image-nvidia-hwe-24.04"]


def healthy(node: str) -> NodeFacts:
    """``node``'s facts as a good box of the ring gives them (the stock 4 KiB kernel: page_size fails)."""
    links = {ep.netdev: LinkFacts(ep.netdev, ep.rdma, "up", 9000, f"{ep.address}/24", 200000, True, 3)
             for ep in INV.endpoints(node)}
    boot = f"{node[-1] * 8}-0000-4000-8000-000000000000"
    return NodeFacts(node=node, kernel="6.17.0-1029-nvidia", page_size_bytes=4096, held_packages=HELD, boot_id=boot,
                     mem_total_kib=127_600_816, mem_available_kib=123_500_000, disk_free_gib=500.0,
                     gpu=GpuFacts("NVIDIA GB10", "12.1", "580.173.02", 208, 3003, None, (), 4.0, 43),
                     links=links, engines=[], clock_lock_record=(boot, 2000))


def ctx(**kw: Any) -> laws.Context:
    """The laws' context over the healthy ring; ``facts`` replaces some nodes', the rest are Context's."""
    facts = {n: healthy(n) for n in INV.names}
    facts.update(kw.pop("facts", {}))
    return laws.Context(profile=kw.pop("profile", DS), inventory=INV, nodes=INV.names, facts=facts, **kw)


# --------------------------------------------------------------------------- the inventory of each bundled profile

# Which example inventory each bundled profile is rendered against (goldens, contracts, real tools).
INVENTORY_FOR = {
    "ds41f-tp4-ring": "inventory.yaml",
    "ds41f-tp4-ring-uncapped": "inventory.yaml",
    "tensorfold-tp4-ring": "inventory.yaml",
    "tiny-llamacpp": "inventory.yaml",
    "tensorfold-tp2": "tests/fixtures/inv-pair.yaml",
    "vllm-tp2-fallback": "tests/fixtures/inv-pair.yaml",
    "sglang-tp2": "tests/fixtures/inv-pair.yaml",
    "llamacpp-1box": "tests/fixtures/inv-single.yaml",
    "tensorfold-tp4x2-switch": "inventory-switch.yaml",
}


# --------------------------------------------------------------------------- a local hub and sparkctl's fetch from it

KIB = 1024
REPO_ID = "org/model"
TOKEN = "hf_sekrit_token_value_0123456789"


def blob(size: int, seed: int) -> bytes:
    """``size`` deterministic bytes from ``seed``."""
    out, block = bytearray(), hashlib.sha256(str(seed).encode()).digest()
    while len(out) < size:
        block = hashlib.sha256(block).digest()
        out += block * 64
    return bytes(out[:size])


FILES = {
    "model-00001-of-00002.safetensors": blob(700 * KIB + 17, 1),
    "model-00002-of-00002.safetensors": blob(300 * KIB + 5, 2),
    "model.safetensors.index.json": b'{"weight_map": {}}\n',
    "config.json": b'{"model_type": "llama"}\n',
    "tokenizer/tokenizer.json": b'{"version": "1.0"}\n',
    "chat_template.jinja": b"{{ messages }}\n",
    "pytorch_model.bin": blob(50 * KIB, 3),
    "original/consolidated.00.pth": blob(40 * KIB, 4),
}


def hub_nodes(tmp_path: Path) -> tuple[Inventory, LocalTransport]:
    """Two local "nodes" a and b under ``tmp_path`` (a LocalTransport, no sudo)."""
    inv = loads_inventory("cluster: {name: t, fabric_pool: 127.22.0.0/16}\ndefaults: {sudo: false}\nnodes:\n"
                          f"  - {{name: a, host: 192.0.2.1, prefix: {tmp_path / 'a'}}}\n"
                          f"  - {{name: b, host: 192.0.2.2, prefix: {tmp_path / 'b'}}}\n"
                          "cables: [[a:p0, b:p0]]\n")
    return inv, LocalTransport(inv.names, sudo=False)


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` and its bytes (not the caches of the client or of sparkctl)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".cache" not in p.parts and ".sparkctl" not in p.parts}


def fetch(tmp_path: Path, h: LocalHub, repo_id: str = REPO_ID, *, token: str | None = TOKEN,
          include: list[str] | None = None, exclude: list[str] | None = None, revision: str = "main",
          max_bytes: int | None = None, chunk_mb: float = 0.125) -> tuple[Any, Any]:
    """sparkctl's fetch of ``repo_id`` from the hub ``h`` onto node a: (its plan, its report)."""
    inv, tr = hub_nodes(tmp_path)
    plan = resolve_fetch(inv, tr, "a", repo_id=repo_id, revision=revision, include=include or ["*"],
                         exclude=exclude if exclude is not None else [], local_dir="/models/m", endpoint=h.endpoint,
                         token=token)
    return plan, fetch_model(inv, tr, plan, token=token, connections=3, chunk_mb=chunk_mb, poll_s=0.05,
                             max_bytes=max_bytes)


# --------------------------------------------------------------------------- a plan run with no hosts


class StubBackend:
    """Runs nothing; every command succeeds; the new replica on ``bad`` never serves (the probe
    fails while the main line's ``ready`` of that replica runs, and succeeds again in the rollback)."""

    def __init__(self, bad: str) -> None:
        self.bad, self.phase, self.t = bad, "", 0.0
        self.records: list[dict[str, Any]] = []
        self.ran: list[tuple[str, str, str]] = []  # (phase, node, command)

    def emit(self, node: str, phase: str, message: str) -> None:
        if node == "*":
            self.phase = phase

    def now(self) -> str:
        return "2026-01-01T00:00:00+00:00"

    def monotonic(self) -> float:
        self.t += 5.0
        return self.t

    def sleep(self, seconds: float) -> None:
        pass

    def probe(self, url: str, served_name: str, metric: str | None, smoke: bool, api_key: Any = None,
              via: str | None = None) -> tuple[bool, str]:
        return (False, "connection refused") if self.phase == "ready" and self.bad in url else (True, "serving")

    def run_all(self, commands: Any, sudo: Any, timeout_s: float | None, stdin: Any = None) -> dict[str, Any]:
        self.ran += [(self.phase, n, c) for n, c in commands.items()]
        return {n: {"ok": True, "exit_code": 0, "stdout": "left:\nports:\n" if "echo \"left:" in c else "alive\n",
                    "stderr": "", "error": ""} for n, c in commands.items()}

    def put_all(self, files: Any, sudo: Any) -> dict[str, Any]:
        self.ran += [(self.phase, n, "put") for n in files]
        return {n: {"ok": True, "exit_code": 0, "stdout": "", "stderr": "", "error": ""} for n in files}

    def write_record(self, node: str, path: str, data: Any, sudo: bool, remove_on_failure: Any) -> dict[str, Any]:
        self.records.append(dict(data))
        return {"ok": True, "exit_code": 0, "stdout": "", "stderr": "", "error": ""}

    def leaks(self, results: Any) -> dict[str, float]:
        return {}

    def check(self, step: Any) -> str:
        return "laws hold"

    def lock(self, step: Any) -> str:
        return "acquired"


class FailsAt(StubBackend):
    """Every probe of ``bad`` (phase, address) pairs fails: the engine there never serves."""

    def __init__(self, bad: set[tuple[str, str]]) -> None:
        super().__init__("nowhere")
        self.bad_at = bad

    def probe(self, url: str, served_name: str, metric: str | None, smoke: bool, api_key: Any = None,
              via: str | None = None) -> tuple[bool, str]:
        if any(self.phase == ph and ip in url for ph, ip in self.bad_at):
            return False, "connection refused"
        return True, "serving"
