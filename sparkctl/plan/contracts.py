"""Engine contracts: what a real engine release accepts and serves, as data.

Owns: loading ``sparkctl/plan/contracts/<engine>-<version>.json`` (extracted by
``tools/engine_contracts.py`` from each release's own source, with the sha256 of
every file it read), the mapping from a profile's ``engine.version`` to the
upstream release it runs (``contracts/versions.json``, each with its reason),
validating a rendered engine command line against the release's parser, and
answering "does this engine serve ENDPOINT / METRIC with these flags".

Pure: reads only its own data files; no shell, no network, no clock.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).parent / "contracts"

DISPLAY = {"vllm": "vLLM", "sglang": "SGLang", "llamacpp": "llama.cpp", "ds41f": "ds41f", "tensorfold": "TensorFold"}

# The tokens counter each engine exports; readiness waits for it on /metrics.
# ds41f and TensorFold are not public projects: no contract says what they serve.
TOKENS_METRIC = {
    "ds41f": "ds41f_generation_tokens_total",
    "tensorfold": "tensorfold_generated_tokens_total",
    "vllm": "vllm:generation_tokens_total",
    "sglang": "sglang:generation_tokens_total",
    "llamacpp": "llamacpp:tokens_predicted_total",
}


@dataclass(frozen=True)
class Flag:
    takes_value: bool
    choices: tuple[str, ...] | None
    canonical: str
    negatable: bool = False
    nargs: str | None = None  # "+", "*" or "?" when argparse takes several values


@dataclass(frozen=True)
class Contract:
    engine: str
    version: str  # the upstream release, e.g. "0.11.2"
    program: str
    subcommand: str | None
    flags: Mapping[str, Flag]
    positionals: tuple[str, ...]
    endpoints: Mapping[str, tuple[str, ...]]  # path -> flags (or conditions) it needs
    metrics: Mapping[str, tuple[str, ...]]  # exported sample name -> flags it needs
    stream_usage_when: str | None  # e.g. "stream_options.include_usage"
    abbrev: bool  # argparse's allow_abbrev: a unique prefix of a long flag is accepted
    underscores_as_dashes: bool  # vLLM's FlexibleArgumentParser: --a_b is --a-b
    upstream: Mapping[str, str]
    sources: tuple[Mapping[str, str], ...]

    @property
    def name(self) -> str:
        return f"{DISPLAY.get(self.engine, self.engine)} {self.version}"


@dataclass(frozen=True)
class Problem:
    """One thing the real release would refuse in a command line."""

    flag: str
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class VersionMap:
    upstream: str
    reason: str


@functools.lru_cache(maxsize=1)
def version_map() -> dict[tuple[str, str], VersionMap]:
    """(engine, profile engine.version) -> the upstream release whose contract applies."""
    raw = json.loads((DATA / "versions.json").read_text())
    return {(r["engine"], r["profile_version"]): VersionMap(r["upstream"], r["reason"]) for r in raw["versions"]}


def upstream_version(engine: str, version: str) -> str | None:
    m = version_map().get((engine, version))
    return m.upstream if m else None


@functools.lru_cache(maxsize=16)
def _load_file(name: str) -> Contract:
    raw = json.loads((DATA / name).read_text())
    flags = {k: Flag(v["takes_value"], tuple(v["choices"]) if v.get("choices") else None, v["canonical"],
                     v.get("negatable", False), v.get("nargs")) for k, v in raw["flags"].items()}
    parser = raw.get("parser", {})
    return Contract(
        engine=raw["engine"], version=raw["version"], program=raw["program"], subcommand=raw.get("subcommand"),
        flags=flags, positionals=tuple(raw.get("positionals", ())),
        endpoints={p: tuple(e.get("requires", ())) for p, e in raw["endpoints"].items()},
        metrics={m: tuple(e.get("requires", ())) for m, e in raw["metrics"].items()},
        stream_usage_when=(raw.get("stream_usage") or {}).get("when"),
        abbrev=bool(parser.get("abbrev")), underscores_as_dashes=bool(parser.get("underscores_as_dashes")),
        upstream=raw.get("upstream", {}), sources=tuple(raw.get("sources", ())),
    )


def load(engine: str, version: str) -> Contract | None:
    """The contract for a profile's (engine.name, engine.version), or None when none exists."""
    up = upstream_version(engine, version)
    if up is None:
        return None
    path = DATA / f"{engine}-{up}.json"
    return _load_file(path.name) if path.is_file() else None


def validated_versions() -> list[tuple[str, str, str]]:
    """(engine, profile version, upstream release) for every mapping that has a contract."""
    return sorted((e, v, m.upstream) for (e, v), m in version_map().items() if load(e, v) is not None)


# --- command lines -------------------------------------------------------------


def _lookup(c: Contract, opt: str) -> tuple[str | None, str | None]:
    """(option string as the contract knows it, error) for one ``--flag`` token."""
    if c.underscores_as_dashes and opt.startswith("--"):
        opt = "--" + opt[2:].replace("_", "-")
    if opt in c.flags:
        return opt, None
    if c.abbrev and opt.startswith("--"):
        hits = sorted(f for f in c.flags if f.startswith(opt) and f.startswith("--"))
        if len(hits) == 1:
            return hits[0], None
        if hits:
            return None, f"ambiguous option {opt} for {c.name}: could match {', '.join(hits)}"
    return None, f"unrecognized argument {opt}: {c.name} has no such flag"


def validate(c: Contract, argv: Sequence[str]) -> list[Problem]:
    """What the release's own parser would refuse in ``argv`` (the arguments after the binary)."""
    args = list(argv)
    problems: list[Problem] = []
    if c.subcommand:
        if not args or args[0] != c.subcommand:
            got = args[0] if args else "nothing"
            return [Problem(c.subcommand, f"{c.program}: expected the subcommand {c.subcommand!r}, got {got!r}")]
        args = args[1:]
    positionals: list[str] = []
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        if not tok.startswith("-") or tok == "-" or _is_number(tok):
            positionals.append(tok)
            continue
        opt, eq, inline = tok.partition("=")
        name, err = _lookup(c, opt)
        if name is None:
            problems.append(Problem(opt, err or opt))
            continue
        f = c.flags[name]
        if not f.takes_value:
            if eq:
                problems.append(Problem(opt, f"argument {f.canonical}: ignored explicit argument {inline!r} "
                                             f"({c.name}: {f.canonical} takes no value)"))
            continue
        values: list[str] = []
        if eq:
            values.append(inline)
        elif f.nargs in ("+", "*"):
            while i < len(args) and (not args[i].startswith("-") or _is_number(args[i])):
                values.append(args[i])
                i += 1
        elif i < len(args) and (not args[i].startswith("-") or _is_number(args[i])):
            values.append(args[i])
            i += 1
        if not values and f.nargs not in ("*", "?"):
            problems.append(Problem(opt, f"argument {f.canonical}: expected a value ({c.name})"))
        for v in values:
            if f.choices is not None and v not in f.choices:
                problems.append(Problem(opt, f"invalid choice {v!r} for {f.canonical}; {c.name} accepts: "
                                             f"{', '.join(f.choices)}"))
    if len(positionals) > len(c.positionals):
        extra = positionals[len(c.positionals):]
        problems.append(Problem(extra[0], f"unrecognized arguments: {' '.join(extra)} ({c.name} takes "
                                          f"{len(c.positionals)} positional argument(s))"))
    return problems


def _is_number(tok: str) -> bool:
    try:
        float(tok)
    except ValueError:
        return False
    return True


def _present(c: Contract, argv: Sequence[str]) -> set[str]:
    """Canonical names of the flags ``argv`` sets (a --no-X form clears X)."""
    on: set[str] = set()
    for tok in argv:
        if not tok.startswith("-") or _is_number(tok):
            continue
        name, _ = _lookup(c, tok.partition("=")[0])
        if name is None:
            continue
        f = c.flags[name]
        if name.startswith("--no-") and name != f.canonical:
            on.discard(f.canonical)
        else:
            on.add(f.canonical)
    return on


def _satisfied(c: Contract, needs: Sequence[str], argv: Sequence[str]) -> bool:
    present = _present(c, argv)
    for n in needs:
        if not n.startswith("-"):
            return False  # a condition that is not a flag (an env variable, a dev mode): not assumed
        name, _ = _lookup(c, n)
        if name is None or c.flags[name].canonical not in present:
            return False
    return True


def serves_endpoint(c: Contract, path: str, argv: Sequence[str]) -> bool:
    return path in c.endpoints and _satisfied(c, c.endpoints[path], argv)


def serves_metric(c: Contract, metric: str, argv: Sequence[str]) -> bool:
    return metric in c.metrics and serves_endpoint(c, "/metrics", argv) and _satisfied(c, c.metrics[metric], argv)


def readiness_metric(engine: str, version: str, argv: Sequence[str]) -> str | None:
    """The tokens counter readiness may wait for, or None when the engine will not serve it.

    With a contract: the engine's counter only if the contract says it is exported
    with these flags (SGLang needs --enable-metrics, llama-server --metrics). No
    contract (ds41f, TensorFold): the counter sparkctl has always used.
    """
    metric = TOKENS_METRIC.get(engine)
    c = load(engine, version)
    if c is None or metric is None:
        return metric
    return metric if serves_metric(c, metric, argv) else None


def warnings(engine: str, version: str, argv_by_node: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """Lines for render, plan and check: an engine version with no contract, and each refusal."""
    c = load(engine, version)
    if c is None:
        return (f"not validated against {DISPLAY.get(engine, engine)} {version}: no engine contract for this "
                "version (docs/engines.md lists the validated ones)",)
    out: list[str] = []
    for node, argv in argv_by_node.items():
        out += [f"{node}: {p.message}" for p in validate(c, argv)]
    return tuple(out)
