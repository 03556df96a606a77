"""The bench runner: workloads, the streaming client, metrics and reports.

Layout (measurement core):

* :mod:`sparkctl.bench.events`   -- the per-request event log and its outcome (data only);
* :mod:`sparkctl.bench.client`   -- the async streaming client that records event logs;
* :mod:`sparkctl.bench.metrics`  -- PURE: event logs -> TTFT, ITL, TPOT, rates, summaries;
* :mod:`sparkctl.bench.refserver` -- a loopback OpenAI-compatible server with known rates;
* :mod:`sparkctl.bench.selftest` -- client + metrics checked against the refserver's closed forms.

Definitions of every metric: ``docs/bench-metrics.md``.
"""
