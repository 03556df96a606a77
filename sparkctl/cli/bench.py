"""The bench command group: run, report, compare, selftest."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from sparkctl.cli.base import (
    Ctx,
    cli,
    emit_json,
    err_console,
    escape,
    inventory_option,
    json_option,
    make_transport,
    out,
    pass_ctx,
)
from sparkctl.errors import ConfigError

# --------------------------------------------------------------------------- bench


class _BenchGroup(click.Group):
    """`sparkctl bench ARGS...` without a subcommand name is `sparkctl bench run ARGS...`.

    (A profile named like a subcommand, e.g. ``report``, needs the explicit ``bench run``.)
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


def _int_list(_ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...] | None:
    """``8192,32768`` or ``8K,32K,128K`` (K = 1024) -> ints."""
    if not value:
        return None
    out = []
    for part in value.replace(" ", "").split(","):
        if not part:
            continue
        mult = 1024 if part[-1] in "kK" else 1
        try:
            n = int(part[:-1] if mult > 1 else part) * mult
        except ValueError:
            raise ConfigError(f"--{param.name}: {part!r} is not a whole number",
                              hint="a comma-separated list, e.g. 8K,32K,128K or 1,4,16") from None
        if n < 1:
            raise ConfigError(f"--{param.name}: {part!r} must be >= 1")
        out.append(n)
    return tuple(out)


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in text).strip("-") or "run"


@cli.group("bench", cls=_BenchGroup, no_args_is_help=True)
def bench_group() -> None:
    """Benchmark a serving stack: `sparkctl bench [PROFILE] --suite S...` (= `bench run`), report, compare."""


@bench_group.command("run")
@inventory_option
@click.argument("profile", required=False)
@click.option("--base-url", metavar="URL", help="benchmark this OpenAI-compatible endpoint (no cluster involved)")
@click.option("--model", metavar="NAME", help="served model name (default: the profile's model.served_name)")
@click.option("--endpoint", type=click.Choice(["gateway", "replica"]), default=None,
              help="bench through the gateway (the cluster's one endpoint; default when serve.gateway is enabled) "
              "or the first replica directly")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="run directory "
              "(default ./runs/<timestamp>-<profile or model>)")
@click.option("--suite", "suites", multiple=True, metavar="SUITE",
              help="prefill, decode, concurrency, agent, longctx, warm-prefix, peak, quality, soak (repeatable; "
                   "default: the profile's bench.suites, else prefill, decode, concurrency)")
@click.option("--record", is_flag=True, help="record grade: 3 repeats; the run must have usage-counted tokens "
              "and no errors, else the command fails (exit 4) after writing everything")
@click.option("--force", is_flag=True, help="bench even when the cluster check fails (recorded), and write into "
              "a non-empty --out")
@click.option("--lengths", callback=_int_list, metavar="N,N,...", help="prompt lengths in tokens for prefill "
              "(and the longctx ladder), e.g. 8K,32K,128K")
@click.option("--concurrency", callback=_int_list, metavar="N,N,...", help="concurrency levels (and agent "
              "session counts), e.g. 1,4,16")
@click.option("--repeats", type=int, help="repeats per point (at least 2; at least 3 with --record)")
@click.option("--duration", "duration_s", type=float, default=600.0, show_default=True, metavar="SECONDS",
              help="length of the soak suite")
@click.option("--decode-tokens", type=int, help="tokens out in decode/concurrency/peak (default: profile, 256)")
@click.option("--warmup-seconds", "warmup_s", type=float, default=10.0, show_default=True,
              help="agent suite: warmup before the measure window")
@click.option("--measure-seconds", "measure_s", type=float, default=60.0, show_default=True,
              help="agent suite: the fixed measure window")
@click.option("--label", help="column label in reports (default: the profile, else the engine tag)")
@click.option("--api-key-env", metavar="VAR", help="the environment variable holding the endpoint's key, sent as "
              "Authorization: Bearer (default: the profile's serve.api_key_env); the key is never printed")
@click.option("--server-metrics", is_flag=True, help="also read the engine's own TTFT and inter-token latency "
              "histograms (/metrics) before and after each suite and report them beside the client's figures "
              "(vLLM; SGLang with --enable-metrics; llama.cpp has none: docs/bench-metrics.md)")
@json_option
@pass_ctx
def bench_run_cmd(c: Ctx, profile: str | None, base_url: str | None, model: str | None, out_dir: str | None,
                  suites: tuple[str, ...], record: bool, force: bool, lengths: tuple[int, ...] | None,
                  concurrency: tuple[int, ...] | None, repeats: int | None, duration_s: float,
                  decode_tokens: int | None, warmup_s: float, measure_s: float, label: str | None,
                  api_key_env: str | None, server_metrics: bool, as_json: bool, endpoint: str | None = None) -> None:
    """Run bench suites against PROFILE's cluster, or against --base-url URL --model NAME."""
    import contextlib

    with contextlib.ExitStack() as stack:
        _bench_run(c, profile, base_url, model, out_dir, suites, record, force, lengths, concurrency, repeats,
                   duration_s, decode_tokens, warmup_s, measure_s, label, as_json, stack, api_key_env,
                   server_metrics, endpoint)


def bench_check(res: Any, inv: Any, transport: Any, force: bool) -> dict[str, Any]:
    """Pre-bench health check: every law on every node; waivers come from the run record."""
    from sparkctl.errors import CheckFailed
    from sparkctl.model.stacks import stack_of
    from sparkctl.ops.check import run_check
    from sparkctl.ops.lock import read_record
    from sparkctl.plan.laws import Waiver

    rec = read_record(inv, transport, stack_of(res))
    waivers = {k: Waiver(k, v) for k, v in (rec.waivers if rec and rec.profile == res.name else {}).items()}
    report = run_check(res, inv, transport, waivers=waivers, bandwidth_s=0)
    fails = [v for v in report.verdicts if v.failed]
    if fails and not force:
        v = fails[0]
        raise CheckFailed(f"pre-bench check: {len(fails)} law(s) fail; first: {v.law} on {v.node}: {v.observed}",
                          hint="fix it, or --force to bench anyway (recorded in every row)")
    facts = [f for f in report.facts.values() if f is not None]
    return {
        "kernel": ",".join(sorted({f.kernel for f in facts if f.kernel})) or None,
        "page_size_kib": ",".join(sorted({str((f.page_size_bytes or 0) // 1024) for f in facts})) or None,
        "clock_lock_mhz": ",".join(sorted({str(f.clock_lock_record[1]) for f in facts
                                           if f.clock_lock_record and f.clock_lock_record[0] == f.boot_id})) or None,
        "waivers": [f"{k}: {w.reason}" for k, w in waivers.items()],
        "unqualified": bool(waivers),
        "check_ok": report.ok,
        "check_failures": [f"{v.law}@{v.node}" for v in fails],
    }


def _figure(v: float | None) -> str:
    return "-" if v is None else (f"{v:,.1f}" if abs(v) >= 1 else f"{v:.4f}")


def _bench_run(c: Ctx, profile: str | None, base_url: str | None, model: str | None, out_dir: str | None,
               suites: tuple[str, ...], record: bool, force: bool, lengths: tuple[int, ...] | None,
               concurrency: tuple[int, ...] | None, repeats: int | None, duration_s: float,
               decode_tokens: int | None, warmup_s: float, measure_s: float, label: str | None,
               as_json: bool, stack: Any, api_key_env: str | None = None, server_metrics: bool = False,
               endpoint: str | None = None) -> None:
    import time as _time

    from sparkctl.bench import runner as bench_runner
    from sparkctl.bench import workloads
    from sparkctl.bench.cluster_hooks import config_from_profile, prepare
    from sparkctl.bench.options import RunOptions
    from sparkctl.bench.results import HEADLINE
    from sparkctl.errors import CheckFailed
    from sparkctl.ops.readiness import operator_key
    from sparkctl.transport.forward import forward

    telemetry = None
    # The endpoint's key, from the operator's variable (serve.api_key_env): checked before
    # anything is probed, so an unset variable is one clear line, not a 401 mid-run.
    key = operator_key(api_key_env or (c.resolve(profile).profile.serve.api_key_env if profile else None))
    if key.problem:
        raise ConfigError(f"the endpoint {key.problem}",
                          hint=f"export {key.env}=<the endpoint's key> (serve.api_key_env names it); "
                               "sparkctl never prints or stores the key")
    if base_url:
        config: dict[str, Any] = config_from_profile(c.resolve(profile)) if profile else {}
        model = model or config.get("served_name")
        if not model:
            raise ConfigError("--base-url needs --model NAME (or a PROFILE to take model.served_name from)")
    elif profile:
        inv = c.inventory()
        transport = make_transport(inv, 5.0, 60.0, 120.0)
        stack.callback(transport.close)

        def check_fn(res: Any, inv: Any, force: bool) -> dict[str, Any]:
            return bench_check(res, inv, transport, force)

        base_url, served, config, _ = prepare(c, profile, force, check_fn=check_fn, endpoint=endpoint)
        via = (config.get("endpoint") or {}).get("via")
        if via:  # serve.bind: fabric: only the head reaches its fabric address; bench through its SSH
            import httpx

            u = httpx.URL(base_url)
            host, port = stack.enter_context(forward(transport, via, u.host, u.port or 80))
            base_url = f"http://{host}:{port}"
            if not as_json:
                err_console().print(f"[dim]{escape(config['endpoint']['url'])} (the head's fabric address) "
                                    f"through {escape(via)}'s SSH connection[/]")
        from sparkctl.facts.telemetry import sampler
        from sparkctl.model.layout import bind

        telemetry = sampler(inv, transport, list(bind(c.resolve(profile), inv).nodes))
        model = model or served
    else:
        raise ConfigError("nothing to benchmark", hint="give a PROFILE, or --base-url URL --model NAME")
    chosen = suites or tuple((config.get("bench") or {}).get("suites") or ())
    options = RunOptions(
        suites=chosen or workloads.DEFAULT_SUITES, repeats=repeats, record=record, lengths=lengths,
        concurrency=concurrency, decode_tokens=decode_tokens, duration_s=duration_s, label=label,
        agent_warmup_s=warmup_s, agent_measure_s=measure_s, server_metrics=server_metrics)
    out_path = Path(out_dir) if out_dir else Path("runs") / f"{_time.strftime('%Y%m%d-%H%M%S')}-{_slug(profile or model)}"
    if out_path.exists() and any(out_path.iterdir()) and not force:
        raise ConfigError(f"{out_path} is not empty", hint="choose another --out, or --force to write into it")
    progress = None if as_json else (lambda m: err_console().print(f"[dim]{escape(m)}[/]"))
    summary = bench_runner.run(base_url, model, out_path, config, options, telemetry=telemetry, progress=progress,
                               api_key=key.key)
    srv = _server_record(summary.out_dir) if server_metrics else None
    if as_json:
        emit_json({**asdict(summary), **({"server_metrics": srv} if srv is not None else {})})
    else:
        t = Table(box=None, pad_edge=False)
        for col in ("point", "metric", "median", "min", "max", "valid/runs", "flags"):
            t.add_column(col, justify="right" if col in ("median", "min", "max") else "left")
        for p in summary.points:
            if p["suite"] == "quality" and p["point"].count("/") > 1:
                continue  # per-scenario rows live in results.csv
            metric = HEADLINE.get(p["suite"], "")
            m = p["metrics"].get(metric) or {}
            t.add_row(p["point"], metric, _figure(m.get("median")), _figure(m.get("min")), _figure(m.get("max")),
                      f"{p['valid_repeats']}/{p['repeats']}", escape(", ".join(p["flags"])[:60]))
        out.print(t)
        for suite, tele in summary.telemetry.items():
            nodes = ", ".join(f"{n} {v['mean_w']:.0f}/{v['peak_w']:.0f} W" for n, v in tele["nodes"].items())
            jpt = tele.get("j_per_completion_token")
            out.print(f"power {suite} (mean/peak): {nodes}" + (f"; {jpt:.2f} J/token" if jpt else ""), markup=False)
        if srv is not None:
            _print_server_metrics(srv)
        out.print(f"{summary.n_requests} requests, {summary.n_errors} errors, {summary.duration_s:.1f} s; "
                  f"wrote {summary.out_dir}/results.csv, events.jsonl, telemetry.csv, run.json", markup=False)
    if record and not summary.record_grade:
        raise CheckFailed("not record grade: " + "; ".join(summary.record_problems), hint=f"see {summary.out_dir}")


def _server_record(out_dir: str) -> dict[str, Any] | None:
    import json

    try:
        # run.json is the runner's own record: server_metrics is an object, or absent
        record: dict[str, Any] | None = json.loads((Path(out_dir) / "run.json").read_text()).get("server_metrics")
        return record
    except (OSError, ValueError):
        return None


def _print_server_metrics(record: dict[str, Any]) -> None:
    """Server-side (the engine's histograms) and client-side TTFT/ITL side by side."""
    from sparkctl.bench.servermetrics import TABLE_HEADER, notes, table_rows

    rows = table_rows(record)
    if rows:
        t = Table(box=None, pad_edge=False, title="server-side vs client-side", title_justify="left")
        for col in TABLE_HEADER:
            t.add_column(col, justify="right" if col in ("server", "client") else "left")
        for r in rows:
            t.add_row(*map(escape, r))
        out.print(t)
    for line in notes(record):
        out.print(line, markup=False)


@bench_group.command("report")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="where report.md and the plots go (default: RUN_DIR/report for one run, else ./runs/report-<time>)")
@click.option("--html", "html_out", is_flag=True, help="also write report.html")
@click.option("--published", type=click.Path(dir_okay=False), help="published-numbers YAML for the reference "
              "columns (default: the copy shipped with sparkctl)")
@json_option
def bench_report_cmd(run_dirs: tuple[str, ...], out_dir: str | None, html_out: bool, published: str | None,
                     as_json: bool) -> None:
    """Comparison table (markdown, optional HTML) and PNG plots over RUN_DIRS, beside the published figures."""
    import time as _time

    from sparkctl.bench.report import build_report

    dest = Path(out_dir) if out_dir else (Path(run_dirs[0]) / "report" if len(run_dirs) == 1
                                          else Path("runs") / f"report-{_time.strftime('%Y%m%d-%H%M%S')}")
    rep = build_report(run_dirs, dest, html_out=html_out, published_path=published)
    if as_json:
        emit_json({"files": list(rep.files), "columns": [c.label for c in rep.columns]})
        return
    click.echo(rep.markdown.split("\n## ")[0].rstrip())
    out.print(f"\nwrote {', '.join(rep.files)}", markup=False)


@bench_group.command("compare")
@click.argument("run_a", type=click.Path(file_okay=False))
@click.argument("run_b", type=click.Path(file_okay=False))
@json_option
def bench_compare_cmd(run_a: str, run_b: str, as_json: bool) -> None:
    """Per-metric ratios B / A of two runs (median over repeats)."""
    from sparkctl.bench.report import compare_runs

    a, b, ratios = compare_runs(run_a, run_b)
    if as_json:
        emit_json({"a": a.label, "b": b.label, "ratios": [asdict(r) for r in ratios]})
        return
    t = Table(box=None, pad_edge=False)
    for col in ("point", "metric", a.label, b.label, "B/A"):
        t.add_column(escape(col), justify="left" if col in ("point", "metric") else "right")

    def f(v: float | None) -> str:
        return "-" if v is None else (f"{v:,.1f}" if abs(v) >= 10 else f"{v:.4g}")

    for r in ratios:
        t.add_row(r.point, r.metric, f(r.a), f(r.b), "-" if r.ratio is None else f"{r.ratio:.3f}")
    out.print(t)


@bench_group.command("selftest")
@click.option("--concurrency", callback=_int_list, metavar="N,N,...", help="concurrency levels (default 1,16)")
@json_option
def bench_selftest_cmd(concurrency: tuple[int, ...] | None, as_json: bool) -> None:
    """Check the bench client and metrics against the reference server's closed forms (exit 0 only when ok)."""
    from sparkctl.bench.selftest import format_report, run_selftest
    from sparkctl.errors import CheckFailed

    report = run_selftest(concurrency or (1, 16))
    if as_json:
        emit_json(asdict(report))
    else:
        click.echo(format_report(report))
    if not report.ok:
        raise CheckFailed(f"bench selftest failed: {len(report.failures())} checks out of tolerance",
                          hint="a busy machine skews timing: rerun when it is quiet")
