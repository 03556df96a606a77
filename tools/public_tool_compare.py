"""A public benchmark tool and sparkctl's client, side by side, against the same reference server.

Starts :mod:`sparkctl.bench.refserver` on 127.0.0.1 with known rates (TTFT =
a, every token g after the first, k tokens per chunk; the prompt-length term
b is 0 so the tools' different prompt generators cannot move the closed
forms), then at each concurrency runs NVIDIA's AIPerf (``aiperf profile``, a
public OpenAI-compatible benchmark that needs no GPU and no torch) and
sparkctl's own client, and prints each tool's error against the closed forms.
Prints figures; asserts nothing. Nothing leaves 127.0.0.1.

AIPerf is NOT a dependency of sparkctl or its tests. Install it into its own
virtual environment (it pulls in ~100 packages):

    python3 -m venv /tmp/aiperf-venv && /tmp/aiperf-venv/bin/pip install aiperf==0.13.0
    python tools/public_tool_compare.py --aiperf /tmp/aiperf-venv/bin/aiperf [--concurrency 1,16]

AIPerf needs a tokenizer to build synthetic prompts. Its ``builtin`` one
downloads an encoding on first use, so this script writes a word-level
tokenizer (HuggingFace ``tokenizer.json`` format, one token per whitespace
word, as the reference server counts) into a temporary directory and passes
its path: no network, and both tools' prompts count the same.

Closed forms (n tokens out, c streams): TTFT = a + (k-1)g; ITL (both
definitions, see below) = g;
per-stream decode rate = 1/g; aggregate output throughput = c*n / (a + (n-1)g),
the rate of c streams kept busy back to back (the time between one request's
end and the next one's start counts against a tool, as it would on a real
server).

Two ITL rows, because the tools name two definitions the same way
(docs/bench-metrics.md, "Two ITLs"): ``itl_gap_p50_ms`` is the median of every
gap between consecutive content chunks, pooled over requests (sparkctl's
``itl_s``; AIPerf's ``inter_chunk_latency``; vLLM's ITL), and ``itl_mean_ms``
is the median request's (last - first content chunk) / (tokens after the first
chunk) (sparkctl's ``tpot_s``; AIPerf's ``inter_token_latency``, which ends at
the last response; vLLM's TPOT). The per-gap figure is the one sensitive to a
client (or server) that is descheduled longer than a gap: two events then
share one read. ``zero_gaps_pct`` (sparkctl only) counts gaps under 0.1 ms,
and every level prints the CPU pressure (/proc/pressure/cpu "some") while it ran.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sparkctl.bench.client import BenchClient, ClientTimeouts, RequestSpec
from sparkctl.bench.metrics import aggregate_throughput, request_metrics
from sparkctl.bench.pressure import cpu_pressure_total_s
from sparkctl.bench.refserver import RefConfig, RefServerProcess

INSTALL = ("AIPerf is not installed (it is not a sparkctl dependency). Install it in its own venv:\n"
           "  python3 -m venv /tmp/aiperf-venv && /tmp/aiperf-venv/bin/pip install aiperf==0.13.0\n"
           "then: python tools/public_tool_compare.py --aiperf /tmp/aiperf-venv/bin/aiperf")


def write_word_tokenizer(d: Path, n_words: int = 5000) -> None:
    """A HuggingFace tokenizer that splits on whitespace only (unknown words -> [UNK], still one word)."""
    vocab = {"[UNK]": 0, "[PAD]": 1, "<s>": 2, "</s>": 3} | {f"w{i}": i for i in range(4, n_words)}
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
           "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
           "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
           "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}}
    d.mkdir(parents=True, exist_ok=True)
    (d / "tokenizer.json").write_text(json.dumps(tok))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "pad_token": "[PAD]",
        "bos_token": "<s>", "eos_token": "</s>", "model_max_length": 1_000_000}))


def run_aiperf(aiperf: str, url: str, c: int, n_req: int, isl: int, osl: int, work: Path) -> dict[str, Any]:
    out = work / f"aiperf-c{c}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HTTP_PROXY", "HTTPS_PROXY", "http_proxy",
                                                                      "https_proxy"))}
    argv = [aiperf, "profile", "--model", "refserver", "--tokenizer", str(work / "tokenizer"),
            "--endpoint-type", "chat", "--streaming", "--url", url, "--concurrency", str(c),
            "--request-count", str(n_req), "--warmup-request-count", str(c), "--isl", str(isl), "--isl-stddev", "0",
            "--osl", str(osl), "--osl-stddev", "0", "--use-server-token-count", "--artifact-dir", str(out),
            "--ui", "none"]
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"aiperf failed (exit {p.returncode}):\n{(p.stdout + p.stderr)[-3000:]}")
    return json.loads((out / "profile_export_aiperf.json").read_text())


async def run_sparkctl(url: str, c: int, n_batches: int, isl: int, osl: int) -> dict[str, float]:
    prompt = " ".join(["lorem"] * (isl - 1))  # + the salt word = isl words
    spec = RequestSpec("chat", "refserver", osl, messages=({"role": "user", "content": prompt},))
    async with BenchClient(url, concurrency=c, timeouts=ClientTimeouts(read_s=30, request_s=120)) as client:
        await client.warm_up(spec)
        batches = [await client.run_batch([spec] * c) for _ in range(n_batches)]
    per = [request_metrics(r.events) for b in batches for r in b]
    agg = [aggregate_throughput([r.events for r in b]).tok_s for b in batches]
    gaps = [x for m in per for x in m.itl_s]
    return {
        "ttft_ms": statistics.median(m.ttft_s for m in per) * 1e3,  # type: ignore[misc]
        "itl_gap_p50_ms": statistics.median(gaps) * 1e3,
        "itl_mean_ms": statistics.median(m.tpot_s for m in per) * 1e3,  # type: ignore[misc]
        "zero_gaps_pct": 100.0 * sum(1 for x in gaps if x < 1e-4) / len(gaps),
        "decode_tok_s": statistics.median(m.decode_tok_s for m in per),  # type: ignore[misc]
        "throughput_tok_s": statistics.median(a for a in agg if a),
    }


def aiperf_figures(d: dict[str, Any]) -> dict[str, float]:
    """AIPerf's p50s (its ``inter_token_latency`` is the per-request mean, sparkctl's TPOT)."""
    return {
        "ttft_ms": d["time_to_first_token"]["p50"],
        "itl_gap_p50_ms": d["inter_chunk_latency"]["p50"],
        "itl_mean_ms": d["inter_token_latency"]["p50"],
        "decode_tok_s": d["output_token_throughput_per_user"]["p50"],
        "throughput_tok_s": d["output_token_throughput"]["avg"],
    }


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f}%"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--aiperf", default=os.environ.get("AIPERF") or shutil.which("aiperf"),
                    help="the aiperf executable (default: $AIPERF, else aiperf on PATH)")
    ap.add_argument("--concurrency", default="1,16", help="levels, comma separated")
    ap.add_argument("--requests-per-stream", type=int, default=6)
    ap.add_argument("--isl", type=int, default=100, help="prompt words (the refserver counts +4 for chat)")
    ap.add_argument("--osl", type=int, default=64)
    ap.add_argument("--ttft-base-s", type=float, default=0.1)
    ap.add_argument("--gap-s", type=float, default=0.005)
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    a = ap.parse_args()
    if not a.aiperf or not Path(a.aiperf).exists():
        print(INSTALL, file=sys.stderr)
        return 2
    cfg = RefConfig(ttft_base_s=a.ttft_base_s, ttft_per_token_s=0.0, gap_s=a.gap_s,
                    tokens_per_chunk=a.tokens_per_chunk)
    k, g, n = cfg.tokens_per_chunk, cfg.gap_s, a.osl
    levels = [int(x) for x in a.concurrency.split(",")]
    rows: list[tuple[int, str, float, float, float]] = []
    psi: dict[int, tuple[float | None, float | None]] = {}

    async def go(work: Path) -> None:
        async with RefServerProcess(cfg) as srv:
            for c in levels:
                p0, t0 = cpu_pressure_total_s(), time.perf_counter()
                ai = aiperf_figures(run_aiperf(a.aiperf, srv.base_url, c, c * a.requests_per_stream, a.isl, n,
                                               work))
                p1, t1 = cpu_pressure_total_s(), time.perf_counter()
                sp = await run_sparkctl(srv.base_url, c, a.requests_per_stream, a.isl, n)
                p2, t2 = cpu_pressure_total_s(), time.perf_counter()
                psi[c] = (None if p0 is None or p1 is None else 100 * (p1 - p0) / (t1 - t0),
                          None if p1 is None or p2 is None else 100 * (p2 - p1) / (t2 - t1))
                rows.append((c, "zero_gaps_pct", 0.0, float("nan"), sp["zero_gaps_pct"]))
                want = {"ttft_ms": (cfg.ttft_base_s + (k - 1) * g) * 1e3, "itl_gap_p50_ms": g * 1e3,
                        "itl_mean_ms": g * 1e3,
                        "decode_tok_s": 1 / g,
                        "throughput_tok_s": c * n / (cfg.ttft_base_s + (n - 1) * g)}
                for metric, e in want.items():
                    rows.append((c, metric, e, ai[metric], sp[metric]))

    with tempfile.TemporaryDirectory(prefix="sparkctl-compare-") as tmp:
        work = Path(tmp)
        write_word_tokenizer(work / "tokenizer")
        asyncio.run(go(work))

    print(f"reference server: TTFT a={cfg.ttft_base_s * 1e3:g} ms (b=0), g={g * 1e3:g} ms, k={k}, {n} tokens out; "
          f"aiperf {a.aiperf}")
    print(f"{'c':>3} {'metric':<18} {'closed form':>12} {'aiperf':>10} {'err%':>8} {'sparkctl':>10} {'err%':>8}")
    for c, metric, e, ai_v, sp_v in rows:
        if metric == "zero_gaps_pct":
            ai_psi, sp_psi = psi[c]
            print(f"{c:>3} {'cpu_pressure_pct':<18} {'':>12} {_pct(ai_psi):>10} {'':>8} {_pct(sp_psi):>10}")
            print(f"{c:>3} {metric:<18} {e:>12.4g} {'':>10} {'':>8} {sp_v:>10.3g}")
            continue
        print(f"{c:>3} {metric:<18} {e:>12.4g} {ai_v:>10.4g} {100 * (ai_v / e - 1):>+8.2f} "
              f"{sp_v:>10.4g} {100 * (sp_v / e - 1):>+8.2f}")
    print("medians over requests (aiperf: its p50s; throughput: aiperf's run average, sparkctl's median batch)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
