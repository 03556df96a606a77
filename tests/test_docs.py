"""Docs stay true: every law has its heading in docs/LAWS.md, every README command exists, the exit codes."""

from __future__ import annotations

import re
from pathlib import Path

from sparkctl.plan.laws import LAWS

REPO = Path(__file__).resolve().parent.parent


def test_every_law_has_a_section_with_why_check_fix() -> None:
    text = (REPO / "docs" / "LAWS.md").read_text()
    headings = re.findall(r"^## (\S+)$", text, re.M)
    assert [law.id for law in LAWS] == headings
    for law in LAWS:
        section = text.split(f"## {law.id}\n", 1)[1].split("\n## ", 1)[0]
        for part in ("**Why.**", "**The check.**", "**The fix.**"):
            assert part in section, (law.id, part)


def test_readme_has_exactly_two_setup_commands_and_ci_runs_the_test_one() -> None:
    readme = (REPO / "README.md").read_text()
    block = readme.split("## Set up", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["make demo", "make test"]
    ci = (REPO / ".ci" / "run").read_text()
    assert [line for line in ci.splitlines() if line and not line.startswith("#")][-1] == "make test"


def test_readme_commands_exist(sparkctl) -> None:
    readme = (REPO / "README.md").read_text()
    blocks = "\n".join(b.split("```", 1)[0] for b in readme.split("```sh")[1:])
    used = set(re.findall(r"^sparkctl (?:-i \S+ )?([a-z-]+)", blocks, re.M))
    from sparkctl.cli.main import cli

    assert used and used <= set(cli.list_commands(None)), used - set(cli.list_commands(None))  # type: ignore[arg-type]


def test_the_exit_code_table_in_architecture_is_the_enum() -> None:
    from sparkctl.errors import ExitStatus

    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    section = text.split("\n## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \| .+ \|$", section, re.M)
    assert [(int(code), name) for code, name in rows] == [(s.value, s.name) for s in ExitStatus]
