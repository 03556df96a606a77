"""Shared test helpers. `pytest --update-golden` regenerates golden files.

Markers (also declared in pyproject.toml): ``e2e`` starts real processes
(sshd, engines, servers) on loopback or in the SIMULATED cluster's namespaces;
``needs_root`` needs root (network namespaces, bridges) and is skipped otherwise.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

REPO = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: end-to-end test that starts real processes (engines, servers) on loopback")
    config.addinivalue_line("markers", "needs_root: needs root (network namespaces, bridges); skipped otherwise")
    _hypothesis_profiles(config)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden from the current rendering")
    parser.addoption("--update-plans", action="store_true", help="rewrite tests/plans/*/expected.json from the planner")
    parser.addoption("--fuzz", action="store_true", help="the hypothesis 'fuzz' profile: --fuzz-cases inputs per "
                     "property (tools/fuzz.py runs the suite this way)")
    parser.addoption("--fuzz-cases", type=int, default=10_000, help="inputs per property under --fuzz")


def _hypothesis_profiles(config: pytest.Config) -> None:
    from hypothesis import HealthCheck, settings

    # The properties in test_fuzz_inputs.py and test_probes.py take their example
    # count from the profile: a few hundred in every run, thousands under --fuzz.
    quiet = [HealthCheck.too_slow]
    settings.register_profile("sparkctl", max_examples=200, deadline=None, suppress_health_check=quiet)
    settings.register_profile("fuzz", max_examples=config.getoption("--fuzz-cases"), deadline=None, database=None,
                              suppress_health_check=list(HealthCheck))
    settings.load_profile("fuzz" if config.getoption("--fuzz") else "sparkctl")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture
def repo() -> Path:
    return REPO


class Run:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err


class _Main:
    """Adapter so CliRunner can drive sparkctl.cli.main.main (which maps errors to exit codes)."""

    name = "sparkctl"

    def __init__(self, main):  # type: ignore[no-untyped-def]
        self._main = main

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):  # type: ignore[no-untyped-def]
        raise SystemExit(self._main(list(args or [])))


@pytest.fixture
def sparkctl(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Run the CLI in-process through main(), as a user would: (code, stdout, stderr)."""
    from sparkctl.cli.main import main

    monkeypatch.setenv("SPARKCTL_SIM_DIR", str(tmp_path / "no-sim"))
    monkeypatch.delenv("SPARKCTL_INVENTORY", raising=False)
    monkeypatch.delenv("SPARKCTL_ROOT", raising=False)

    def run(*args: str) -> Run:
        result = CliRunner().invoke(_Main(main), list(args), catch_exceptions=False)  # type: ignore[arg-type]
        return Run(result.exit_code, result.stdout, result.stderr)

    return run
