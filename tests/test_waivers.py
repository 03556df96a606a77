"""--waive: only laws whose check honours a waiver take one; anything else is one clear refusal."""

from __future__ import annotations

import pytest

from sparkctl.cli.base import parse_waivers
from sparkctl.errors import ConfigError
from sparkctl.plan.laws import LAWS


def test_waivable_laws_take_a_waiver_with_its_reason() -> None:
    w = parse_waivers(("page_size", "nccl_version"), "stock kernel; image rebuilt next week")
    assert set(w) == {"page_size", "nccl_version"} and w["page_size"].reason.startswith("stock")
    with pytest.raises(ConfigError, match="needs --reason"):
        parse_waivers(("page_size",), " ")


@pytest.mark.parametrize("law", sorted(x.id for x in LAWS if not x.waivable))
def test_a_law_whose_check_ignores_waivers_refuses_one(law: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_waivers((law,), "because")
    assert "cannot be waived" in e.value.one_line() and "page_size" in e.value.one_line()


def test_unknown_law() -> None:
    with pytest.raises(ConfigError, match="no such law"):
        parse_waivers(("no_such",), "x")
