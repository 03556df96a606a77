"""The ``metrics`` command group: the Prometheus scrape configuration for the exporters and engines. No host."""

from __future__ import annotations

import click

from sparkctl.cli.base import Ctx, cli, inventory_option, pass_ctx, set_option


@cli.group("metrics")
def metrics_group() -> None:
    """Prometheus: what to scrape (each node's exporter, each engine that serves /metrics)."""


@metrics_group.command("config")
@click.argument("profile", required=False)
@inventory_option
@set_option
@click.option("--interval-s", type=click.IntRange(1, 3600), default=15, show_default=True, help="scrape interval")
@pass_ctx
def metrics_config_cmd(c: Ctx, profile: str | None, sets: tuple[str, ...], interval_s: int) -> None:
    """Print the scrape_configs for a Prometheus: every node's exporter; with PROFILE, each head's engine
    /metrics where the profile's rendered flags serve it, and its gateway's (serve.gateway; docs/observability.md)."""
    from sparkctl.plan.exporterplan import engine_targets, gateway_target, scrape_config
    from sparkctl.plan.render import render

    inv = c.inventory()
    engines = gateway = None
    if profile:
        res = c.resolve(profile, sets)
        engines = engine_targets(res, inv, render(res, inv, c.roots(), {}))
        gateway = gateway_target(res, inv)
    click.echo(scrape_config(inv, engines, interval_s, gateway), nl=False)  # plain: YAML is no rich markup
