#!/usr/bin/env python3
"""The full fault matrix (issue #7) on the SIMULATED ring: a table and a JSON file.

Builds its own simulated ring under a private directory (holding the host's sim
lock for the whole run), runs every cell of ``faultmatrix.matrix()`` (tests/faultmatrix.py)
(or the cells named with --cell, or the CI set with --reduced), prints a Markdown
table and writes every outcome as JSON. Exit 1 when any cell failed.

Usage: flock-free; it takes /run/sparkctl-sim/e2e-tests.lock itself.
    python3 tools/fault_matrix.py --out /tmp/fault-matrix
    python3 tools/fault_matrix.py --cell up/during_ready/rank_killed --cell down/during_stop/sigint
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from faultmatrix import (  # noqa: E402 - tests/faultmatrix.py, a test driver
    REDUCED,
    Cell,
    Outcome,
    Ring,
    matrix,
    na_reason,
    run_cell,
    table,
)

LOCK = Path("/run/sparkctl-sim/e2e-tests.lock")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="directory for fault-matrix.json, table.md and logs")
    ap.add_argument("--cell", action="append", default=[], metavar="COMMAND/PHASE/FAULT")
    ap.add_argument("--reduced", action="store_true", help="only the CI set (one cell per fault kind)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("the simulated ring's namespaces need root", file=sys.stderr)
        return 2
    if args.cell:
        cells = [Cell(*c.split("/")) for c in args.cell]
    elif args.reduced:
        cells = list(REDUCED)
    else:
        cells = [c for c, _ in matrix()]
    out_dir = args.out or Path(tempfile.mkdtemp(prefix="fault-matrix-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="fm-sim-"))
    env = {**os.environ, "SPARKCTL_SIM_DIR": str(tmp / "sim"), "XDG_STATE_HOME": str(tmp / "state"),
           "SPARKCTL_SIM_SPEEDUP": "20", "SPARKCTL_SIM_LOAD_S": "1"}
    env.pop("SPARKCTL_INVENTORY", None)
    sim = [sys.executable, "-m", "sparkctl.cli", "sim"]
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    # SIGTERM tears the ring down like Ctrl-C does (the finally below).
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    outcomes: list[Outcome] = []
    t_all = time.monotonic()
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            r = subprocess.run([*sim, "up", "--nodes", "4"], env=env, capture_output=True, text=True, timeout=300)
            if r.returncode != 0:
                print(r.stdout + r.stderr, file=sys.stderr)
                return 2
            ring = Ring(tmp / "sim", tmp / "sim" / "inventory.yaml", env, out_dir / "cells",
                        say=lambda m: print(m, file=sys.stderr, flush=True))
            for cell in cells:
                if na_reason(cell):
                    outcomes.append(run_cell(ring, cell))
                    continue
                try:
                    outcomes.append(run_cell(ring, cell))
                except Exception as exc:  # noqa: BLE001 - the driver failed, not the cell: say so and go on
                    outcomes.append(Outcome(cell.id, "FAIL", problems=[f"driver: {type(exc).__name__}: {exc}"]))
                    print(f"{cell.id}: driver error {exc}", file=sys.stderr)
        finally:
            subprocess.run([*sim, "down"], env=env, capture_output=True, text=True, timeout=300)
            fcntl.flock(lock, fcntl.LOCK_UN)
    took = time.monotonic() - t_all
    ran = [o for o in outcomes if o.status != "n/a"]
    failed = [o for o in ran if o.status != "ok"]
    md = table(outcomes)
    summary = (f"{len(ran)} cells run, {len(outcomes) - len(ran)} n/a, {len(failed)} failed; "
               f"orphans {sum(o.orphans or 0 for o in ran)}, corrupt records "
               f"{sum(1 for o in ran if o.record_intact is False)}, run time {took / 60:.1f} min")
    (out_dir / "table.md").write_text(md + "\n\n" + summary + "\n")
    (out_dir / "fault-matrix.json").write_text(json.dumps(
        {"summary": summary, "seconds": round(took, 1), "outcomes": [o.to_dict() for o in outcomes]},
        indent=2) + "\n")
    print(md)
    print()
    print(summary)
    for o in failed:
        print(f"FAIL {o.cell}: {'; '.join(o.problems)}")
    print(f"wrote {out_dir}/fault-matrix.json and table.md")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
