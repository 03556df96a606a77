"""Service facts: the engine processes (ps), the listening TCP ports (ss or
/proc/net/tcp), the served models (``GET /v1/models``) and what sparkctl's
weights agent vouches for (``weights_agent.py summary``).

What this module owns: the pure parsers of those outputs, the engine command
line pattern, and the :class:`~sparkctl.facts.registry.Fact` entries. It must
not run anything.
"""

from __future__ import annotations

import json
import re
from typing import Any

from sparkctl.facts.nodefacts import EngineProc, EngineUnit, WeightsSummary
from sparkctl.facts.registry import (
    NOT_FOUND,
    ExitCode,
    Fact,
    ProbeParseError,
    ScriptContext,
    int_in,
    lines,
    q,
    tool,
)
from sparkctl.model.engines import ENGINE_PATTERN, ENGINE_REGEX
from sparkctl.model.paths import UNIT, under

MARKER_PREFIX = "@@sparkctl:"

# How long the node may take to answer /v1/models; the brief: curl -m 3.
MODELS_TIMEOUT_S = 3
AGENT = "weights_agent.py summary"
MODELS_TOOL = "GET /v1/models"


def parse_engines(text: str) -> list[EngineProc]:
    """``ps -eo pid,args`` (whole or grepped, header required): the engine
    processes. The probe's own shell (its command line carries the markers) is
    left out."""
    found = lines(text)
    if not found or not re.fullmatch(r"\s*PID\s+(COMMAND|ARGS|CMD)", found[0]):
        raise ProbeParseError("engine processes", "no ps header line", "ps")
    out = []
    for line in found[1:]:
        m = re.fullmatch(r"\s*([0-9]+)\s+(.*)", line)
        if not m:
            raise ProbeParseError("engine processes", f"unexpected line {line.strip()[:50]!r}", "ps")
        args = m.group(2).strip()
        if MARKER_PREFIX in args or not ENGINE_PATTERN.search(args):
            continue
        out.append(EngineProc(int(m.group(1)), args))
    return out


def parse_listening_ports(text: str) -> set[int]:
    """``ss -ltn[p][H]`` or ``/proc/net/tcp[6]``: the TCP ports in LISTEN."""
    ports: set[int] = set()
    for line in lines(text):
        cells = line.split()
        if cells[0] in ("State", "Netid", "sl"):
            continue
        if cells[0] == "LISTEN" and len(cells) >= 4:
            local = cells[3]
            port = local.rsplit(":", 1)[-1]
            if ":" not in local or not port.isdigit():
                raise ProbeParseError("listening TCP ports", f"unexpected address {local[:40]!r}", "ss")
            ports.add(int_in("listening TCP ports", port, 0, 65535, "ss"))
        elif re.fullmatch(r"[0-9]+:", cells[0]) and len(cells) >= 4:
            m = re.fullmatch(r"[0-9A-F]+:([0-9A-F]{4})", cells[1])
            if not m or not re.fullmatch(r"[0-9A-F]{2}", cells[3]):
                raise ProbeParseError("listening TCP ports", f"unexpected /proc/net/tcp line {line[:50]!r}", "ss")
            if cells[3] == "0A":  # TCP_LISTEN
                ports.add(int(m.group(1), 16))
        else:
            raise ProbeParseError("listening TCP ports", f"unexpected line {line.strip()[:50]!r}", "ss")
    return ports


_WEIGHT_KINDS = ("dir", "file", "missing")


def parse_weights_summary(text: str) -> WeightsSummary:
    """The last JSON line of ``weights_agent.py summary``: a ``summary`` event (or its ``error``)."""
    what = "weights summary"
    doc: Any = None
    for line in reversed(text.strip().splitlines()):
        try:
            doc = json.loads(line)
        except (ValueError, RecursionError):
            continue
        break
    if not isinstance(doc, dict):
        raise ProbeParseError(what, "no JSON line" if doc is None else "not a JSON object", AGENT)
    if doc.get("event") == "error":
        raise ProbeParseError(what, f"the agent said: {str(doc.get('message'))[:200]}", AGENT)
    if doc.get("event") != "summary" or doc.get("kind") not in _WEIGHT_KINDS:
        raise ProbeParseError(what, f"not a summary (event {str(doc.get('event'))[:40]!r}, "
                                    f"kind {str(doc.get('kind'))[:40]!r})", AGENT)

    def count(key: str) -> int:
        v = doc.get(key, 0)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ProbeParseError(what, f"{key} is not a count: {str(v)[:40]!r}", AGENT)
        return v

    digest = doc.get("digest")
    if digest is not None and not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)):
        raise ProbeParseError(what, f"digest is not a SHA-256: {str(digest)[:80]!r}", AGENT)
    listed = doc.get("unverified", [])
    if not isinstance(listed, list) or not all(isinstance(x, str) for x in listed):
        raise ProbeParseError(what, "unverified is not a list of paths", AGENT)
    hub = {k: doc.get(k) if isinstance(doc.get(k), str) else None for k in ("hub_repo", "hub_commit")}
    return WeightsSummary(kind=doc["kind"], files=count("files"), bytes=count("bytes"), digest=digest,
                          n_unverified=count("n_unverified"), unverified=tuple(listed), partial=count("partial"),
                          n_hub_differ=count("n_hub_differ"), **hub)


UNIT_PROPS = ("LoadState", "UnitFileState", "ActiveState", "Result", "NRestarts")
UNIT_TOOL = "systemctl show"


def parse_engine_unit(text: str) -> EngineUnit:
    """``systemctl show -p LoadState,UnitFileState,ActiveState,Result,NRestarts``: KEY=VALUE lines.

    systemd prints the properties asked for, in its own order; a unit it does
    not know still answers (LoadState=not-found, Result=success, NRestarts=0).
    """
    what = "engine unit"
    props: dict[str, str] = {}
    for line in lines(text):
        key, eq, value = line.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z]+", key):
            raise ProbeParseError(what, f"unexpected line {line.strip()[:50]!r}", UNIT_TOOL)
        props[key] = value.strip()
    missing = [k for k in ("LoadState", "ActiveState", "Result", "NRestarts") if k not in props]
    if missing:
        raise ProbeParseError(what, f"no {', '.join(missing)}", UNIT_TOOL)
    return EngineUnit(load_state=props["LoadState"], unit_file_state=props.get("UnitFileState", ""),
                      active_state=props["ActiveState"], result=props["Result"],
                      n_restarts=int_in(what, props["NRestarts"], 0, None, UNIT_TOOL))


def parse_models(text: str) -> list[str]:
    """``GET /v1/models``: the ids of the OpenAI ``data`` array (vLLM, SGLang,
    llama.cpp, which adds an Ollama-style ``models`` array, used only when
    ``data`` is missing)."""
    what = "served models"
    if not text.strip():
        raise ProbeParseError(what, "empty response", MODELS_TOOL)
    try:
        doc: Any = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ProbeParseError(what, f"not JSON ({str(exc)[:80]})", MODELS_TOOL) from None
    if not isinstance(doc, dict):
        raise ProbeParseError(what, "not a JSON object", MODELS_TOOL)
    if isinstance(doc.get("data"), list):
        items, key = doc["data"], "id"
    elif isinstance(doc.get("models"), list):
        items, key = doc["models"], "name"
    else:
        raise ProbeParseError(what, f"no data array (keys: {', '.join(sorted(map(str, doc))[:5])})", MODELS_TOOL)
    out = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get(key), str):
            raise ProbeParseError(what, f"an entry without a string {key!r}", MODELS_TOOL)
        out.append(item[key])
    return out


# --------------------------------------------------------------------------- facts

# The [x]yz classes keep grep from matching its own command line; the header
# line proves ps ran. parse_engines filters again (it is the contract).
ENGINES = Fact("engines", "engine processes",
               lambda c, _: tool("ps", "-eo", "pid,args") + " | grep -iE -e '^ *PID ' -e " + q(ENGINE_REGEX),
               parse_engines)
# No -p: the owner's name is never read, and -p makes ss walk every process's open files
# (iproute2 misc/ss.c user_ent_hash_build, /proc/*/fd) to find it, on a box with hundreds.
PORTS = Fact("ports", "listening TCP ports", lambda c, _: (
    "if have ss; then ss -ltnH 2>/dev/null || ss -ltn; "
    f"else cat {q(c.proc + '/net/tcp')} && {{ cat {q(c.proc + '/net/tcp6')} 2>/dev/null; true; }}; fi"),
    parse_listening_ports)


# The models fact's exit code for an HTTP 401 answer. curl's own codes are 1..99; 41
# (CURLE_FUNCTION_NOT_FOUND, curl(1) EXIT CODES) is one a plain GET never returns.
NEEDS_KEY_RC = 41


def _auth_header(ctx: ScriptContext) -> str:
    """sh that prints ``Authorization: Bearer <key>`` from the head's 0600 env file (readable by
    the login user, else through ``sudo -n``; nothing when neither can read it). The key only
    passes a pipe: ``printf`` is a shell builtin (no exec, so no argv in /proc) and curl reads
    the header from stdin (``-H @-``, curl 7.55+). The env file is sparkctl's own, every
    value quoted for sh, so sourcing it sets variables and runs nothing (engine.env.j2)."""
    assert ctx.endpoint_key is not None
    env_file, var = ctx.endpoint_key
    # no newline after the header: curl takes a last line without one, and the batch
    # script carries no backslash (tests/test_probes.py)
    body = f"set -a; . {q(env_file)} && printf 'Authorization: Bearer %s' \"${var}\""
    return (f"{{ {{ [ -r {q(env_file)} ] && ( {body} ); }} || {{ have sudo && sudo -n sh -c {q(body)}; }}; }} "
            "2>/dev/null")


def _models(ctx: ScriptContext, _: str) -> str:
    """GET /v1/models at the address the endpoint listens on (serve.bind: an engine bound to its
    fabric or management address does not answer on 127.0.0.1), with the key when one is needed.
    curl appends ``|http=<code>`` (``-w``) and the shell splits it off; python3's urllib is told
    to hand back error answers instead of raising, so both exit NEEDS_KEY_RC on a 401."""
    host = ctx.endpoint_host or "127.0.0.1"
    url = f"http://{host}:{int(ctx.endpoint_port or 0)}/v1/models"
    hdr = _auth_header(ctx) if ctx.endpoint_key else ":"
    py = ("import sys,urllib.request as u;u.HTTPErrorProcessor.http_response=lambda s,q,r:r;"
          "h=sys.stdin.read().strip();q=u.Request(sys.argv[1]);h and q.add_header(*h.split(': ',1));"
          f"r=u.urlopen(q,timeout={MODELS_TIMEOUT_S});"
          f"sys.exit({NEEDS_KEY_RC}) if r.status==401 else sys.stdout.write(r.read().decode())")
    curl = (f"out=$({hdr} | curl -s -m {MODELS_TIMEOUT_S} -H @- -w '|http=%{{http_code}}' {q(url)}); rc=$?; "
            f"[ $rc -eq 0 ] || exit $rc; [ \"${{out##*|http=}}\" = 401 ] && exit {NEEDS_KEY_RC}; "
            "printf '%s' \"${out%|http=*}\"")
    return (f"if have curl; then {curl}; "
            f"elif have python3; then {hdr} | python3 -c {q(py)} {q(url)}; else exit 127; fi")


# curl's exit codes (curl(1), EXIT CODES): 7 failed to connect, 28 timed out.
MODELS = Fact("models", "served models (/v1/models)", _models, parse_models, core=False,
              when=lambda c: c.endpoint_port is not None,
              exit_codes=(NOT_FOUND,
                          ExitCode(7, "unreadable", "connection refused (nothing listening on the endpoint port?)"),
                          ExitCode(28, "unreadable", f"no answer within {MODELS_TIMEOUT_S} s"),
                          ExitCode(NEEDS_KEY_RC, "unreadable", "needs key: the endpoint answered 401 Unauthorized "
                                   "(serve.api_key_env: the key is missing or wrong)")))


def _weights(ctx: ScriptContext, _: str) -> str:
    w = ctx.weights
    assert w is not None
    # what the agent's hash cache vouches for (stat only, nothing hashed)
    return (f"[ -e {q(w.agent)} ] || exit 3; have python3 || exit 127; "
            f"python3 -S {q(w.agent)} summary --dir {q(w.root)} --hash-cache {q(w.hash_cache)}")


# exit 3: no agent on the node, so sparkctl never fetched or synced here: nothing is vouched for.
WEIGHTS = Fact("weights", "the weights (sparkctl's hash cache)", _weights, parse_weights_summary, core=False,
               when=lambda c: c.weights is not None,
               exit_codes=(NOT_FOUND, ExitCode(3, "absent", "no weights agent", value=WeightsSummary("no-agent"))))


def _engine_unit(ctx: ScriptContext, _: str) -> str:
    unit = under(ctx.node.prefix, UNIT)
    return (f"[ -e {q(unit)} ] || exit 3; have systemctl || exit 127; "
            f"systemctl show -p {','.join(UNIT_PROPS)} sparkctl-engine.service")


# exit 3: no engine unit on the node (never rendered there, or a detached supervisor):
# nothing for systemd to report. ``status`` reads Result=start-limit-hit from it: a
# persisted rank that failed StartLimitBurst= times stays down (systemd.unit(5)).
ENGINE_UNIT = Fact("engine_unit", "the engine unit (systemctl show)", _engine_unit, parse_engine_unit, core=False,
                   exit_codes=(NOT_FOUND, ExitCode(3, "absent", "no engine unit", value=None)))
