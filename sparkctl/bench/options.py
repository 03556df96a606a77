"""What a bench run is asked to do: :class:`RunOptions`, validated when made.

A leaf of the bench package: :mod:`sparkctl.bench.runner` and the suites and
fitting beside it read it, and it imports none of them (the three once formed
an import cycle through it).
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkctl.bench import workloads as wl
from sparkctl.bench.client import ClientTimeouts
from sparkctl.errors import ConfigError


@dataclass(frozen=True)
class RunOptions:
    """What to run. ``None`` = the profile's ``bench`` default, else the workloads default."""

    suites: tuple[str, ...] = wl.DEFAULT_SUITES
    repeats: int | None = None
    record: bool = False
    lengths: tuple[int, ...] | None = None          # prefill lengths (and the needle ladder's, for longctx)
    concurrency: tuple[int, ...] | None = None      # concurrency levels (and agent session counts)
    decode_tokens: int | None = None
    duration_s: float = 600.0                       # soak
    label: str | None = None
    agent_warmup_s: float = 10.0
    agent_measure_s: float = 60.0
    agent_cooldown_s: float = 30.0                  # the most an in-flight request may run after the window
    agent_corpora: tuple[str, ...] = ("draftable", "adversarial")
    needle_depths: tuple[float, ...] = wl.DEFAULT_NEEDLE_DEPTHS
    warm_prefix_tokens: int = wl.DEFAULT_WARM_PREFIX_TOKENS
    quality_concurrency: int = 8
    soak_concurrency: int = wl.DEFAULT_SOAK_CONCURRENCY
    soak_scale: float = 1.0                         # scales the soak mix's prompt lengths
    telemetry_interval_s: float = 1.0
    timeouts: ClientTimeouts = ClientTimeouts()
    server_metrics: bool = False
    """Read the engine's own TTFT/ITL histograms around every suite (:mod:`sparkctl.bench.servermetrics`)."""
    client_workers: int | None = None
    """Worker processes (event loops) for a client: None = one per core for
    released-together points of >= ``POOL_MIN_STREAMS`` streams, else one loop
    (:mod:`sparkctl.bench.pool`); 1 = always one loop."""

    def __post_init__(self) -> None:
        bad = [s for s in self.suites if s not in wl.SUITES]
        if bad:
            raise ConfigError(f"unknown suite {bad[0]!r}", hint=f"suites: {', '.join(wl.SUITES)}")
        if self.repeats is not None and self.repeats < 1:
            raise ConfigError("--repeats must be >= 1")
