"""A file copy on a simulated node that fills its simulated page cache.

SIMULATION ONLY. The simulated node's /proc/meminfo is rendered from its state
file (sparkctl_sim.nodestate), so real file reads in its namespace do not move
it. ``python -m sparkctl_sim.pagecache cp SRC DST`` copies a file for real and
then accounts what the kernel would keep cached: the pages read from SRC and
the pages written to DST (Documentation/admin-guide/mm/concepts.rst, "Page
Cache"): MemFree falls by them, MemAvailable does not. ``drop`` is what writing
3 to /proc/sys/vm/drop_caches does (the node's drop_caches is a bind-mounted
file the state absorbs on its next edit: nodestate.absorb_drop_caches).

The node's state file: $SPARKCTL_SIM_STATE.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from sparkctl_sim import nodestate


def _sparse_copy(src: str, dst: str) -> int:
    """Copy only the data extents (SEEK_DATA/SEEK_HOLE) and keep holes as holes, as coreutils
    `cp --sparse=auto` (its default) does: the tests copy sparse files of tens of GiB, and a
    plain copy would write them out in full and fill the machine's disk."""
    size = os.path.getsize(src)
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        fd, pos = fi.fileno(), 0
        while pos < size:
            try:
                data = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:  # ENXIO: no data after pos
                break
            hole = os.lseek(fd, data, os.SEEK_HOLE)
            fi.seek(data)
            fo.seek(data)
            left = hole - data
            while left > 0:
                chunk = fi.read(min(left, 1 << 24))
                if not chunk:
                    break
                fo.write(chunk)
                left -= len(chunk)
            pos = hole
        fo.truncate(size)
    return size


def copy(src: str, dst: str, state_path: str) -> int:
    size = _sparse_copy(src, dst)
    with nodestate.edit(state_path) as s:
        nodestate.fill_page_cache(s, 2 * size)
    return size


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    state = os.environ.get("SPARKCTL_SIM_STATE", "")
    if not state:
        print("pagecache: SPARKCTL_SIM_STATE is not set", file=sys.stderr)
        return 2
    if len(args) == 3 and args[0] == "cp":
        copy(args[1], args[2], state)
        return 0
    if len(args) == 2 and args[0] == "fill-bytes" and args[1].isdigit():
        with nodestate.edit(state) as s:
            nodestate.fill_page_cache(s, int(args[1]))
        return 0
    print("usage: python -m sparkctl_sim.pagecache cp SRC DST | fill-bytes N", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
