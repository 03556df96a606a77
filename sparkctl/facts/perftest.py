"""The bandwidth report of perftest's ``ib_write_bw`` (and its ``*_bw`` siblings).

What this module owns: the pure parser of the result table, which reads the
columns and their units from the table's own header and converts every
bandwidth to Gb/s. It must not run anything.

The header variants, from linux-rdma/perftest src/perftest_parameters.h
(``RESULT_FMT*``) and the order they are printed in (src/write_bw.c: the
header, then ``RESULT_EXT`` or ``RESULT_EXT_CPU_UTIL``):

* ``--report_gbits``: ``BW peak[Gb/sec]    BW average[Gb/sec]``
  (``RESULT_FMT_G``); Gb = 10^9 bits (``format_factor`` 125000000 bytes in
  print_report_bw, src/perftest_parameters.c);
* the default: ``BW peak[MB/sec]`` up to perftest 24.04, ``BW peak[MiB/sec]``
  from 24.07 (commit 1d202bb "Display proper unit for MiB/sec results": the
  number did not change, only its name); both are 2^20 bytes
  (``format_factor`` 0x100000);
* ``--cpu_util`` (duration mode only) adds ``CPU_Util[%]`` after
  ``MsgRate[Mpps]`` (``RESULT_EXT_CPU_UTIL``), and each row a value;
* ``--report-per-port`` adds ``BW Port1[..]  MsgRate Port1[Mpps]  BW Port2[..]
  MsgRate Port2[Mpps]``; raw-Ethernet QoS tables add ``#sl``;
* an average below 0.1 Gb/s is printed with 6 decimals (``REPORT_FMT_EXT``).

A result row is matched to the header column by column; a header or row this
parser does not know is refused (:class:`ProbeParseError`), never guessed at.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from sparkctl.facts.registry import ProbeParseError

TOOL = "ib_write_bw"
WHAT = "RDMA bandwidth"

# bytes per second in one unit of the header (perftest print_report_bw: format_factor)
_BYTES_PER_S = {"Gb/sec": 125_000_000, "MB/sec": 0x100000, "MiB/sec": 0x100000}
_COLUMN = re.compile(r"#\w+|[A-Za-z_]+(?: [A-Za-z0-9]+)?\[[^\]]*\]")
_NAMED = re.compile(r"([A-Za-z_ 0-9]+)\[([^\]]*)\]")
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")
# columns whose unit is fixed by perftest, and the bandwidth columns (any _BYTES_PER_S unit)
_FIXED_UNITS = {"MsgRate": "Mpps", "MsgRate Port1": "Mpps", "MsgRate Port2": "Mpps", "CPU_Util": "%"}
_BW_COLUMNS = ("BW peak", "BW average", "BW Port1", "BW Port2")
_COUNT_COLUMNS = ("#bytes", "#iterations", "#sl")


@dataclass(frozen=True)
class BwRow:
    size_bytes: int
    iterations: int
    bw_peak_gbps: float
    bw_average_gbps: float
    msg_rate_mpps: float
    cpu_util_pct: float | None = None


@dataclass(frozen=True)
class BwReport:
    unit: str  # the header's bandwidth unit, as printed: Gb/sec | MB/sec | MiB/sec
    columns: tuple[str, ...]
    rows: tuple[BwRow, ...]

    @property
    def bw_average_gbps(self) -> float:
        """The average at the largest message size; several rows of that size
        (``--run_infinitely`` prints one per interval) are averaged."""
        top = max(r.size_bytes for r in self.rows)
        vals = [r.bw_average_gbps for r in self.rows if r.size_bytes == top]
        return round(sum(vals) / len(vals), 4)


def _header(line: str) -> tuple[list[str], str]:
    """(column names, bandwidth unit) of a ``#bytes ...`` header line."""
    cols = _COLUMN.findall(line)
    if re.sub(r"\s+", "", "".join(cols)) != re.sub(r"\s+", "", line):
        raise ProbeParseError(WHAT, f"header has text that is not a column: {line.strip()[:90]!r}", TOOL)
    names: list[str] = []
    bw_units: set[str] = set()
    for col in cols:
        if col.startswith("#"):
            if col not in _COUNT_COLUMNS:
                raise ProbeParseError(WHAT, f"unknown column {col!r}", TOOL)
            names.append(col)
            continue
        m = _NAMED.fullmatch(col)
        assert m is not None
        name, unit = m.group(1).strip(), m.group(2)
        if name in _BW_COLUMNS:
            if unit not in _BYTES_PER_S:
                raise ProbeParseError(WHAT, f"{name} is in [{unit}], not Gb/sec, MB/sec or MiB/sec", TOOL)
            bw_units.add(unit)
        elif _FIXED_UNITS.get(name) != unit:
            raise ProbeParseError(WHAT, f"unknown column {col!r}", TOOL)
        names.append(name)
    if "BW average" not in names or "#bytes" not in names or "#iterations" not in names:
        raise ProbeParseError(WHAT, f"header without #bytes, #iterations and BW average: {line.strip()[:90]!r}", TOOL)
    if len(bw_units) != 1:
        raise ProbeParseError(WHAT, f"bandwidth columns in different units {sorted(bw_units)}", TOOL)
    return names, bw_units.pop()


def _gbps(row: dict[str, str], name: str, unit: str) -> float:
    x = float(row[name]) * _BYTES_PER_S[unit] * 8 / 1e9
    if not math.isfinite(x):
        raise ProbeParseError(WHAT, f"{name} reads {row[name][:20]!r}", TOOL)
    return round(x, 4)


def parse_bw_report(text: str) -> BwReport:
    """The result table of a perftest bandwidth test, bandwidths in Gb/s."""
    header: tuple[list[str], str] | None = None
    rows: list[BwRow] = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#bytes"):
            h = _header(s)
            if header is not None and h != header:
                raise ProbeParseError(WHAT, "two result tables with different columns", TOOL)
            header = h
            continue
        if not s or not s[0].isdigit():
            continue  # banner, separators, "Client closed connection", warnings
        if header is None:
            continue  # numbers before the table (none in perftest's own layout)
        cells = s.split()
        names, unit = header
        if len(cells) != len(names) or not all(_NUMBER.fullmatch(c) for c in cells):
            raise ProbeParseError(WHAT, f"row {s[:90]!r} does not fit the header's {len(names)} columns", TOOL)
        v = dict(zip(names, cells))
        if not v["#bytes"].isdigit() or not v["#iterations"].isdigit():
            raise ProbeParseError(WHAT, f"#bytes/#iterations not counts in {s[:90]!r}", TOOL)
        rows.append(BwRow(
            size_bytes=int(v["#bytes"]), iterations=int(v["#iterations"]),
            bw_peak_gbps=_gbps(v, "BW peak", unit) if "BW peak" in v else 0.0,
            bw_average_gbps=_gbps(v, "BW average", unit),
            msg_rate_mpps=float(v.get("MsgRate", "0")),
            cpu_util_pct=float(v["CPU_Util"]) if "CPU_Util" in v else None,
        ))
    if header is None:
        raise ProbeParseError(WHAT, "no result header (#bytes #iterations BW peak BW average MsgRate)", TOOL)
    if not rows:
        # a wrong GID index (-x) prints the header and no row, exit 0 (docs/reference/spark-facts.md §4.1)
        raise ProbeParseError(WHAT, "a result header but no result row (wrong GID index? the peer gone?)", TOOL)
    return BwReport(header[1], tuple(header[0]), tuple(rows))


def parse_ib_write_bw(text: str) -> float:
    """BW average in Gb/s, whatever unit the header reports it in (see the module docstring)."""
    return parse_bw_report(text).bw_average_gbps
