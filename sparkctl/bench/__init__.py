"""The bench runner: workloads, the streaming client, metrics and reports.

Layout (measurement core):

* :mod:`sparkctl.bench.events`   -- the per-request event log and its outcome (data only);
* :mod:`sparkctl.bench.client`   -- the async streaming client that records event logs;
* :mod:`sparkctl.bench.sse`      -- the client's SSE reading: byte stream -> frames -> events;
* :mod:`sparkctl.bench.metrics`  -- PURE: event logs -> TTFT, ITL, TPOT, rates, summaries;
* :mod:`sparkctl.bench.refserver` -- a loopback OpenAI-compatible server with known rates;
* :mod:`sparkctl.bench.selftest` -- client + metrics checked against the refserver's closed forms;
* :mod:`sparkctl.bench.capacity` -- the events/s the client itself absorbs (in-process or in worker processes);
* :mod:`sparkctl.bench.pressure` -- CPU pressure over a window: PSI, our run-queue wait, others' CPU.

Suites, runs and reports:

* :mod:`sparkctl.bench.workloads` -- PURE: prompts with exact token counts and every suite's plan;
* :mod:`sparkctl.bench.quality`   -- PURE: the structured-output scenarios and their rule-based scorers;
* :mod:`sparkctl.bench.runner`    -- runs suites against an endpoint, writes the run directory;
* :mod:`sparkctl.bench.results`   -- the run directory's files: columns, atomic writes, reading back;
* :mod:`sparkctl.bench.report`    -- comparison table (markdown/HTML), plots, compare;
* :mod:`sparkctl.bench.cluster_hooks` -- profile + inventory -> endpoint, configuration, telemetry.

Definitions of every metric: ``docs/bench-metrics.md``; the suites: ``docs/bench.md``.
"""
