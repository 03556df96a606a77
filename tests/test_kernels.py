"""The kernel data file (sparkctl/plan/laws/kernels.yaml) and its extension by an inventory or a profile."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from sparkctl.model.inventory import loads_inventory
from sparkctl.model.profiles import resolve
from sparkctl.model.resources import Roots
from sparkctl.plan import laws
from sparkctl.plan.laws import kernels

from helpers import DS, INV, ctx, healthy

REPO = Path(__file__).resolve().parent.parent


def kernel_verdict(c: laws.Context, node: str = "spark-b") -> laws.Verdict:
    return next(v for v in laws.judge(c) if v.law == "kernel_pin" and v.node == node)


def test_every_entry_names_its_evidence_and_a_repo_source_exists() -> None:
    book = kernels.bundled()
    assert {"6.17.0-1031-nvidia", "7.0.0-1019-nvidia"} <= set(book.bad)
    assert "6.17.0-1029-nvidia" in book.good and book.pin() == "6.17.0-1029-nvidia"
    for e in [*book.bad.values(), *book.good.values()]:
        assert e.sources and e.reason
        for s in e.sources:
            assert s.startswith("https://github.com/") or (REPO / s).is_file(), s


def test_the_data_file_is_shipped_inside_the_package() -> None:
    # hatch's wheel target ships every file under sparkctl/ (pyproject: packages = ["sparkctl", ...])
    assert (REPO / "sparkctl" / "plan" / "laws" / "kernels.yaml").is_file()
    assert "packages = [\"sparkctl\"" in (REPO / "pyproject.toml").read_text()


@pytest.mark.parametrize("text,msg", [
    ("bad:\n  - release: 'x y'\n    sources: [{source: a, says: b}]\n", "not a kernel release"),
    ("good:\n  - release: 6.17.0-1029-nvidia\n    reason: r\n", "needs sources"),
    ("bad:\n  - release: 6.17.0-1\n    sources: [{source: a}]\n", "needs sources"),
])
def test_an_entry_without_evidence_is_refused(text: str, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        kernels.parse(text)


def test_bundled_bad_release_cites_its_report() -> None:
    v = kernel_verdict(ctx(facts={"spark-b": replace(healthy("spark-b"), kernel="7.0.0-1019-nvidia")}))
    assert v.failed and "ibv_reg_mr_iova2" in v.fix and "issues/14" in v.fix and "6.17.0-1029-nvidia" in v.fix


def test_a_bundled_good_release_passes() -> None:
    assert kernel_verdict(ctx(facts={"spark-b": replace(healthy("spark-b"), kernel="6.17.0-1032-nvidia")})).status == "ok"


def _prof(**kernels_key) -> object:
    return DS.model_copy(update={"laws": DS.laws.model_copy(update={"kernels": DS.laws.kernels.model_copy(update=kernels_key)})})


def test_a_profile_adds_a_good_and_a_bad_release() -> None:
    odd = replace(healthy("spark-b"), kernel="6.17.0-1021-nvidia")
    assert kernel_verdict(ctx(facts={"spark-b": odd})).failed
    assert kernel_verdict(ctx(facts={"spark-b": odd}, profile=_prof(good=["6.17.0-1021-nvidia"]))).status == "ok"
    v = kernel_verdict(ctx(profile=_prof(bad={"6.17.0-1029-nvidia": "our soak wedged"})))
    assert v.failed and "our soak wedged" in v.fix and "profile" in v.fix


def test_bad_wins_over_good_whoever_lists_it() -> None:
    bad = replace(healthy("spark-b"), kernel="6.17.0-1031-nvidia")
    assert kernel_verdict(ctx(facts={"spark-b": bad}, profile=_prof(good=["6.17.0-1031-nvidia"]))).failed


def test_an_inventory_extends_it_site_wide() -> None:
    text = (REPO / "inventory.yaml").read_text() + "\nlaws:\n  kernels:\n    good: [6.17.0-1021-nvidia]\n"
    inv = loads_inventory(text)
    assert inv.kernels.good == ["6.17.0-1021-nvidia"]
    odd = replace(healthy("spark-b"), kernel="6.17.0-1021-nvidia")
    c = laws.Context(profile=DS, inventory=inv, nodes=INV.names,
                     facts={**{n: healthy(n) for n in INV.names}, "spark-b": odd})
    assert kernel_verdict(c).status == "ok"


def test_a_profile_file_key_reaches_the_law(tmp_path: Path) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "mine.yaml").write_text(
        "extends: ds41f-tp4-ring\nlaws:\n  kernels:\n    bad:\n      6.17.0-1029-nvidia: seen wedging here\n")
    p = resolve("mine", Roots.make(root=str(tmp_path), env={})).profile
    assert p.laws.kernels.bad == {"6.17.0-1029-nvidia": "seen wedging here"}
    assert kernel_verdict(ctx(profile=p)).failed
