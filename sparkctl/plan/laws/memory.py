"""Laws about memory before and while serving: the page cache (``page_cache``).

Pure checks over NodeFacts; remedies as data. Nothing here touches a host.

Why MemFree and not MemAvailable: on GB10 the GPU allocates from the same
memory as the kernel, and ``cudaMemGetInfo`` reports MemFree as "free" (the page
cache is not counted free: ollama/ollama#12283, vllm-project/vllm#35356, and
NVIDIA's DGX Spark known issue "Memory reporting differences with unified
memory architecture"). vLLM's worker refuses to start when that free memory is
below ``gpu_memory_utilization x total`` ("Free memory on device ... is less
than desired GPU memory utilization", vllm/v1/worker/gpu_worker.py in 0.11.2,
init_device). vLLM 0.11.2 itself swaps in psutil's MemAvailable on compute
capability 12.1 (vllm/utils/mem_utils.py MemorySnapshot.measure), releases and
engines without that branch do not; the law is the stricter of the two, and its
remedy is cheap (a big weights copy just before ``up`` is what fills the cache).
"""

from __future__ import annotations

import shlex

from sparkctl.plan.laws.base import FAIL, OK, SKIP, Context, Remedy, Verdict, each

# Engines whose command line asks for a fraction of total memory
# (render.engine_argv: --gpu-memory-utilization / --mem-fraction*).
FRACTION_ENGINES = ("ds41f", "tensorfold", "vllm", "sglang")


def need_kib(total_kib: int, utilization: float) -> int:
    """What the engine will ask for at start: ``gpu_memory_utilization x total``
    (vLLM's ``requested_memory``, gpu_worker.py init_device)."""
    return int(total_kib * utilization)


def drop_caches_commands(proc_root: str = "/proc") -> tuple[str, ...]:
    """sync first (dirty pages are not dropped, Documentation/admin-guide/sysctl/vm.rst
    drop_caches), then free page cache, dentries and inodes (3)."""
    target = (proc_root.rstrip("/") or "") + "/sys/vm/drop_caches"
    return ("sync", f"echo 3 > {shlex.quote(target)}")


def drop_caches_if_short_command(utilization: float, proc_root: str = "/proc") -> str:
    """One shell line for ``up``: drop the caches only when MemFree, read at that
    moment, is below what the engine will ask for (the stale stack has been stopped
    by then, so facts read at check time would be out of date)."""
    meminfo = shlex.quote((proc_root.rstrip("/") or "") + "/meminfo")
    pct = round(utilization * 100)
    return (f"set -- $(awk '/^MemTotal:/{{t=$2}} /^MemFree:/{{f=$2}} END{{print t, f}}' {meminfo}); "
            f'if [ "$2" -lt $(( $1 * {pct} / 100 )) ]; then ' + "; ".join(drop_caches_commands(proc_root))
            + '; echo "dropped caches: MemFree $2 kB < '  + f'{pct}% of $1 kB"; '
            + 'else echo "MemFree $2 kB: enough"; fi')


def check_page_cache(ctx: Context) -> list[Verdict]:
    p = ctx.profile
    out: list[Verdict] = []
    util = p.laws.gpu_memory_utilization
    for node, f in each(ctx, "page_cache", "meminfo", out):
        if p.engine.name not in FRACTION_ENGINES:
            out.append(Verdict("page_cache", node, SKIP, f"{p.engine.name} asks for no memory fraction",
                               "MemFree >= utilization x total"))
            continue
        if getattr(f, "engines", None):
            out.append(Verdict("page_cache", node, SKIP, "an engine runs (its memory is not free)",
                               "judged before start"))
            continue
        if f.mem_free_kib is None or f.mem_total_kib is None:
            out.append(Verdict("page_cache", node, SKIP, "MemFree not read", "MemFree >= utilization x total"))
            continue
        need = need_kib(f.mem_total_kib, util)
        free, gib = f.mem_free_kib, 1024 * 1024
        seen = f"MemFree {free / gib:.1f} GiB (MemAvailable {(f.mem_available_kib or 0) / gib:.1f} GiB)"
        want = f">= {need / gib:.1f} GiB ({util:g} x {f.mem_total_kib / gib:.1f} GiB)"
        if free >= need:
            out.append(Verdict("page_cache", node, OK, seen, want))
        else:
            out.append(Verdict("page_cache", node, FAIL, seen, want,
                               f"the page cache holds memory the engine will ask for: `sparkctl check --fix` "
                               f"drops it on {node} (sync; echo 3 > /proc/sys/vm/drop_caches); `up` does it "
                               "before start"))
    return out


def remedy_page_cache(ctx: Context, verdicts: list[Verdict]) -> Remedy | None:
    bad = [v for v in verdicts if v.failed]
    if not bad:
        return None
    return Remedy("page_cache", True,
                  {v.node: drop_caches_commands(ctx.inventory.node(v.node).proc_root) for v in bad},
                  readback="grep -E '^(MemFree|MemAvailable):' /proc/meminfo",
                  text="write dirty pages back, then drop the page cache, dentries and inodes")
