"""Switched clusters: the inventory's switch (errors with file, line, key), the binder on 8 and 16 nodes,
which laws apply behind a switch, and the fabric probes' targets."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from sparkctl.errors import InventoryError, ProfileError
from sparkctl.facts.nodefacts import LinkFacts
from sparkctl.model.inventory import load_inventory, loads_inventory
from sparkctl.model.layout import bind
from sparkctl.model.profiles import resolve
from sparkctl.model.resources import Roots
from sparkctl.ops.check import _fabric_targets, replica_groups, subnet_pairs, switch_pairs
from sparkctl.plan import laws

from helpers import REPO, healthy

ROOTS = Roots.make(env={})
SW8 = load_inventory(REPO / "inventory-switch.yaml")


def switched(n: int, ports: str = "p0", extra: str = "") -> str:
    names = [f"s{i:02d}" for i in range(1, n + 1)]
    nodes = "".join(f"  - {{name: {m}, host: 10.0.0.{i}}}\n" for i, m in enumerate(names, 1))
    cables = "".join(f"  - [{m}:{p}, switch]\n" for m in names for p in ports.split(","))
    return f"{extra}nodes:\n{nodes}cables:\n{cables}"


def test_the_example_switch_inventory_puts_each_twin_of_p1_on_its_own_subnet() -> None:
    assert SW8.topology == "switch" and SW8.switch_name == "qsfp-switch" and SW8.switch_mtu == 9216
    assert SW8.routes == () and SW8.neighbours("spark-01") == ()
    assert {lk.subnet for lk in SW8.links} == {"10.40.0.0/24", "10.41.0.0/24"}
    assert [e.address for e in SW8.endpoints("spark-03")] == ["10.40.0.3", "10.41.0.3"]
    assert [e.netdev for e in SW8.endpoints("spark-03")] == ["enp1s0f1np1", "enP2p1s0f1np1"]
    assert SW8.primary_address("spark-08") == "10.40.0.8"


def test_both_cages_on_the_switch_give_four_port_groups_from_the_pool() -> None:
    inv = loads_inventory(switched(16, "p0,p1", "cluster: {fabric_pool: 10.50.0.0/16}\n"))
    assert len(inv.names) == 16 and len(inv.endpoints("s16")) == 4
    assert sorted({lk.subnet for lk in inv.links}) == [f"10.50.{k}.0/24" for k in range(4)]
    assert {e.address for e in inv.endpoints("s16")} == {f"10.50.{k}.16" for k in range(4)}


BAD = [
    ("mixing a direct cable", switched(3) + "  - [s01:p1, s02:p1]\n", 9, "cables[3]",
     "runs node to node in a switched cluster"),
    ("a node on no switch port", switched(3).replace("  - [s03:p0, switch]\n", ""), 4, "nodes[2].name",
     "has no port on the switch"),
    ("duplicate subnets", "switch:\n  subnets:\n    p0: [10.40.0.0/24, 10.40.0.0/24]\n" + switched(3), 3,
     "switch.subnets.p0[1]", "share subnet 10.40.0.0/24"),
    ("not a /24", "switch:\n  subnets:\n    p0: [10.40.0.0/23, 10.42.0.0/24]\n" + switched(3), 3,
     "switch.subnets.p0[0]", "is not a /24"),
    ("mtu above the switch's", "cluster: {fabric_mtu_bytes: 9216}\nswitch: {mtu_bytes: 9000}\n" + switched(3), 1,
     "cluster.fabric_mtu_bytes", "more than the switch carries"),
    ("a switch with ring cables", "switch: {name: sw}\n" + (REPO / "inventory.yaml").read_text(), 1, "switch",
     "no cable runs to it"),
    ("no shared cage", switched(3).replace("[s02:p0, switch]", "[s02:p1, switch]"), 3, "nodes[1].name",
     "share no switch subnet"),
]


@pytest.mark.parametrize("name,text,line,key,words", BAD, ids=[b[0] for b in BAD])
def test_a_bad_switch_inventory_is_one_error_with_file_line_key_and_hint(
        name: str, text: str, line: int, key: str, words: str, tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    with pytest.raises(InventoryError) as exc:
        load_inventory(path)
    err = exc.value
    assert words in err.message and err.hint
    assert err.ref is not None and err.ref.file == str(path) and err.ref.key == key and err.ref.line == line


def test_two_tp4_replicas_on_eight_nodes_meet_on_their_own_heads_over_p1() -> None:
    lay = bind(resolve("tensorfold-tp4x2-switch", ROOTS), SW8)
    assert lay.layout == "switch" and [len(r) for r in lay.replicas] == [4, 4]
    assert [r.node for r in lay.heads()] == ["spark-01", "spark-05"]
    for rep in lay.replicas:
        assert {r.master_addr for r in rep} == {rep[0].host_ip}
        for r in rep:
            assert r.host_ip.startswith("10.40.0.") and r.hca == ("rocep1s0f1", "roceP2p1s0f1")
            assert r.socket_ifnames == ("enp1s0f1np1",)


@pytest.mark.parametrize("tp,replicas", [(2, 8), (4, 4), (8, 2)])
def test_tp2_tp4_tp8_replicas_fill_sixteen_switched_nodes(tp: int, replicas: int) -> None:
    inv = loads_inventory(switched(16, "p0,p1"))
    res = resolve("tensorfold-tp4x2-switch", ROOTS, [f"topology.tp_size={tp}", f"topology.replicas={replicas}"])
    lay = bind(res, inv)
    assert [len(r) for r in lay.replicas] == [tp] * replicas
    assert len(set(lay.nodes)) == 16
    head = lay.replicas[-1][0]
    assert head.master_addr == f"10.20.0.{16 - tp + 1}" and len(head.hca) == 4  # both cages, both twins


def test_any_node_set_binds_and_a_replica_uses_only_the_port_groups_all_its_nodes_share() -> None:
    text = switched(8, "p0").replace("  - [s02:p0, switch]\n", "  - [s02:p0, switch]\n  - [s02:p1, switch]\n")
    inv = loads_inventory(text)
    res = resolve("tensorfold-tp4x2-switch", ROOTS, ["topology.replicas=1", "topology.nodes=[s07,s02,s05,s08]"])
    lay = bind(res, inv)
    assert [r.node for r in lay.ranks] == ["s02", "s05", "s07", "s08"]  # inventory order
    assert lay.rank_of("s02").hca == ("rocep1s0f0", "roceP2p1s0f0")  # its p1 is on no peer's subnet
    pair = bind(resolve("tensorfold-tp2", ROOTS, ["topology.nodes=[s08, s01]"]), inv)  # a pair: any two nodes
    assert [(r.node, r.master_addr) for r in pair.ranks] == [("s01", "10.20.0.1"), ("s08", "10.20.0.1")]


def test_ring_layout_behind_a_switch_and_switch_layout_on_a_ring_are_refused_with_a_hint() -> None:
    with pytest.raises(ProfileError) as exc:
        bind(resolve("tensorfold-tp4-ring", ROOTS), loads_inventory(switched(4)))
    assert "layout switch" in (exc.value.hint or "")
    with pytest.raises(ProfileError) as exc:
        bind(resolve("tensorfold-tp4x2-switch", ROOTS, ["topology.replicas=1"]),
             load_inventory(REPO / "inventory.yaml"))
    assert "needs a switched inventory" in exc.value.message


# --------------------------------------------------------------------------- laws behind a switch

SW_RESOLVED = resolve("tensorfold-tp4x2-switch", ROOTS)
SW_PROFILE = SW_RESOLVED.profile
SW_GROUPS = replica_groups(bind(SW_RESOLVED, SW8))  # two TP4 replicas: spark-01..04, spark-05..08


def _facts(node: str):  # type: ignore[no-untyped-def]
    links = {ep.netdev: LinkFacts(ep.netdev, ep.rdma, "up", 9000, f"{ep.address}/24", 200000, True, 3)
             for ep in SW8.endpoints(node)}
    return replace(healthy("spark-a"), node=node, links=links)


def _ctx(probes: tuple[laws.LinkProbe, ...]) -> laws.Context:
    return laws.Context(profile=SW_PROFILE, inventory=SW8, nodes=SW8.names,
                        facts={n: _facts(n) for n in SW8.names}, link_probes=probes)


def _probes(dead: str = "") -> tuple[laws.LinkProbe, ...]:
    out = []
    for node, ts in _fabric_targets(SW8, SW8.names, SW_GROUPS).items():
        for t in ts:
            if t.kind == "df":
                out.append(laws.LinkProbe(node, t.netdev, t.peer, t.address, df_ping_ok=dead not in (node, t.peer)))
    return tuple(out)


def _of(c: laws.Context, law: str) -> list[laws.Verdict]:
    return [v for v in laws.judge(c) if v.law == law]


def test_each_replicas_pairs_and_the_ring_around_the_subnet_are_pinged_once_and_nothing_else() -> None:
    assert SW_GROUPS == (("spark-01", "spark-02", "spark-03", "spark-04"),
                         ("spark-05", "spark-06", "spark-07", "spark-08"))
    targets = _fabric_targets(SW8, SW8.names, SW_GROUPS)
    t = targets["spark-03"]
    assert {x.kind for x in t} == {"df"}
    assert {(x.netdev, x.address.rsplit(".", 2)[0]) for x in t} == {("enp1s0f1np1", "10.40"), ("enP2p1s0f1np1", "10.41")}
    for netdev in ("enp1s0f1np1", "enP2p1s0f1np1"):
        pairs = [(n, x.peer) for n, ts in targets.items() for x in ts if x.netdev == netdev]
        inside = {frozenset((a, b)) for g in SW_GROUPS for a in g for b in g if a != b}
        ring = {frozenset(("spark-04", "spark-05")), frozenset(("spark-08", "spark-01"))}
        assert len(pairs) == len({frozenset(p) for p in pairs}), "every pair once, in one direction"
        assert {frozenset(p) for p in pairs} == inside | ring, "no pair across replicas but the ring's"
        sent = [sum(1 for n, _ in pairs if n == node) for node in SW8.names]
        assert max(sent) - min(sent) <= 1, "each port sends about as many pings as the others"


def test_without_groups_each_port_pings_the_next_around_the_subnet() -> None:
    pairs = [(n, x.peer) for n, ts in _fabric_targets(SW8, SW8.names).items() for x in ts
             if x.netdev == "enp1s0f1np1"]
    names = list(SW8.names)
    assert sorted(pairs) == sorted((a, names[(k + 1) % 8]) for k, a in enumerate(names))


@pytest.mark.parametrize("n", range(1, 18))
def test_subnet_pairs_covers_each_pair_once_and_spreads_the_senders(n: int) -> None:
    pairs = subnet_pairs(list(range(n)))
    assert sorted(tuple(sorted(p)) for p in pairs) == [(a, b) for a in range(n) for b in range(a + 1, n)]
    sent = [sum(1 for a, _ in pairs if a == k) for k in range(n)]
    assert max(sent, default=0) - min(sent, default=0) <= 1


@pytest.mark.parametrize("n,size", [(n, size) for n in (1, 2, 3, 4, 8, 16) for size in (1, 2, 4, 8)])
def test_switch_pairs_are_the_groups_pairs_and_the_ring_each_once_and_grow_with_n_not_its_square(
        n: int, size: int) -> None:
    ends = list(range(n))
    groups = [ends[i:i + size] for i in range(0, n - n % size, size)]  # the rest in no replica
    pairs = switch_pairs(ends, groups)
    got = [frozenset(p) for p in pairs]
    want = ({frozenset((a, b)) for g in groups for a in g for b in g if a != b}
            | {frozenset((k, (k + 1) % n)) for k in range(n) if n > 1})
    assert len(got) == len(set(got)) and set(got) == want
    assert len(pairs) <= n * (size + 1) // 2 + n
    if n >= 3:  # every end is in at least two pairs: two witnesses for its verdict
        assert all(sum(1 for p in got if k in p) >= 2 for k in ends)


def test_a_healthy_switch_passes_switch_subnet_and_fabric_and_skips_the_ring_only_law() -> None:
    c = _ctx(_probes())
    sw = _of(c, "switch_subnet")
    assert len(sw) == 16 and {v.status for v in sw} == {laws.OK}
    assert {v.status for v in _of(c, "fabric")} == {laws.OK} and len(_of(c, "fabric")) == 16
    nccl = _of(c, "nccl_version")
    assert {v.status for v in nccl} == {laws.SKIP} and "switched cluster" in nccl[0].observed


def test_a_port_no_peer_reaches_fails_switch_subnet_naming_its_node_and_only_it() -> None:
    c = _ctx(_probes(dead="spark-06"))
    bad = [v for v in _of(c, "switch_subnet") if v.failed]
    assert {v.node for v in bad} == {"spark-06"} and len(bad) == 2
    # its peers are the ones it was probed with: its replica (the ring's neighbours are in it)
    assert "answers none of its 3 peers" in bad[0].observed and "spark-06:enp1s0f1np1" in bad[0].fix
    ok = next(v for v in _of(c, "switch_subnet") if v.node == "spark-05")
    assert "not spark-06" in ok.observed and "3 of 4 peers" in ok.observed  # its replica and spark-04
    other = next(v for v in _of(c, "switch_subnet") if v.node == "spark-01")
    assert other.status == laws.OK and "spark-06" not in other.observed, "a replica that never pinged it"


def test_two_ports_that_miss_only_each_other_fail_at_both_ends() -> None:
    probes = tuple(replace(p, df_ping_ok=False) if {p.node, p.peer} == {"spark-02", "spark-03"}
                   and p.netdev == "enp1s0f1np1" else p for p in _probes())
    bad = [v for v in _of(_ctx(probes), "switch_subnet") if v.failed]
    assert {v.node for v in bad} == {"spark-02", "spark-03"} and "spark-03" in bad[0].observed


def test_without_probes_the_law_is_skipped_and_on_a_ring_it_says_nothing() -> None:
    assert {v.status for v in _of(_ctx(()), "switch_subnet")} == {laws.SKIP}
    from helpers import ctx
    assert _of(ctx(), "switch_subnet") == []


# --------------------------------------------------------------------------- the simulator's switch (pure parts)


def test_the_simulated_switch_spec_carries_every_twin_named_as_on_a_spark_and_survives_its_json() -> None:
    import dataclasses

    from sparkctl_sim.clusterfaults import _with_peers
    from sparkctl_sim.clusterroot import SWITCH_PEER, _node_links, _spec_from_json
    from sparkctl_sim.switch import bridge_name, port_name
    from sparkctl_sim.topology import sim_inventory_text, spec_from_inventory

    text = sim_inventory_text(16, Path("/tmp/sim"), False, "switch")
    inv = loads_inventory(text)
    assert inv.topology == "switch" and len(inv.names) == 16 and inv.names[-1] == "spark-p"
    spec = spec_from_inventory(inv, False)
    assert spec.links == () and spec.routes == () and len(spec.switch_ports) == 32
    assert {sp.group for sp in spec.switch_ports} == {"p0.0", "p0.1"} and spec.switch_mtu == 9216
    assert _node_links(spec, "spark-c") == [("enp1s0f0np0", "10.40.0.3/24", SWITCH_PEER, "p0.0"),
                                            ("enP2p1s0f0np0", "10.40.1.3/24", SWITCH_PEER, "p0.1")]
    assert _with_peers(spec, ["spark-c"]) == ["spark-c"]  # a port down changes no other node's carrier
    assert _spec_from_json(json.loads(json.dumps(dataclasses.asdict(spec)))) == spec
    assert bridge_name("p0.1") == "pg-p0.1" and port_name(spec, spec.switch_ports[-1]) == "sw31"
    assert all(len(x) <= 15 for x in ("pg-p1.1", "sw31"))  # IFNAMSIZ


def test_sim_up_refuses_a_switch_size_it_does_not_build() -> None:
    from sparkctl_sim.topology import sim_inventory_text

    with pytest.raises(ValueError, match="2, 4, 8, 16"):
        sim_inventory_text(5, Path("/tmp/sim"), False, "switch")
    with pytest.raises(ValueError, match="needs root"):
        sim_inventory_text(8, Path("/tmp/sim"), True, "switch")


# --------------------------------------------------------------------------- pipeline stages behind a switch


def test_vllm_and_sglang_run_tp4_x_pp2_on_eight_switched_nodes_with_flags_their_contracts_accept() -> None:
    from sparkctl.plan import contracts
    from sparkctl.plan.render import engine_argv

    for profile, pp_flag in (("vllm-tp2-fallback", "--pipeline-parallel-size"), ("sglang-tp2", "--pp-size")):
        res = resolve(profile, ROOTS, ["topology.layout=switch", "topology.tp_size=4", "topology.pp_size=2"])
        lay = bind(res, SW8)
        assert len(lay.replicas) == 1 and [r.world_size for r in lay.ranks] == [8] * 8
        r = lay.rank_of("spark-06")
        argv = engine_argv(res.profile, r, "/w", "0.0.0.0")
        tp_flag = "--tensor-parallel-size" if profile.startswith("vllm") else "--tp-size"
        assert argv[argv.index(tp_flag) + 1] == "4" and argv[argv.index(pp_flag) + 1] == "2"
        assert argv[argv.index("--nnodes") + 1] == "8" and argv[argv.index("--node-rank") + 1] == "5"
        e = res.profile.engine
        assert contracts.warnings(e.name, e.version, {"spark-06": argv}) == ()
        assert contracts.warnings(e.name, e.version, {"spark-06": [*argv, "--no-such-flag"]})  # it can fail


def test_pp_size_is_refused_off_a_switch_and_for_an_engine_without_pipeline_stages(tmp_path: Path) -> None:
    from sparkctl.errors import SparkctlError

    with pytest.raises(SparkctlError, match="pp_size > 1 needs layout switch"):
        resolve("vllm-tp2-fallback", ROOTS, ["topology.pp_size=2"])
    with pytest.raises(SparkctlError, match="runs no pipeline stages"):
        resolve("tensorfold-tp4x2-switch", ROOTS, ["topology.pp_size=2", "topology.replicas=1"])
