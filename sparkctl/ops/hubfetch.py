"""A profile's whole model from the Hugging Face Hub, on the one internet-facing node.

Two stages, plan then apply: :func:`resolve` asks the node's agent for the
revision listing (``hub-info``: the node, not the operator's machine, faces
the internet) and turns it into a :class:`~sparkctl.ops.hub.HubPlan` (pure:
:mod:`sparkctl.ops.hub`), refusing a disk that cannot hold it; a dry run stops
there. :func:`fetch_model` hands the plan to a detached ``hub-fetch`` job and
watches it as :func:`sparkctl.ops.weights.fetch` watches a one-file download.

The token is found on the operator's machine where huggingface_hub finds it
(:func:`find_token`) and travels on the agent's stdin only: never on a
command line (``ps``), never in a file on the node, never in a message.

What it must not do: print, prompt or exit.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from sparkctl.errors import Ref
from sparkctl.model.inventory import Inventory
from sparkctl.model.paths import under
from sparkctl.ops import hub
from sparkctl.ops.agentjobs import (
    Agent,
    Pace,
    ProgressCallback,
    WeightsError,
    hash_cache_path,
    parse_events,
    push_agent,
    report_progress,
)
from sparkctl.ops.hub import HubError, HubPlan
from sparkctl.transport import Transport

INFO_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class HubToken:
    """A Hub token and where it was found (an environment variable or the token file); never printed."""

    value: str = field(repr=False)
    source: str


def _clean_token(raw: str | None) -> str | None:
    # huggingface_hub utils/_auth.py _clean_token: newlines and surrounding blanks go; empty is none
    if raw is None:
        return None
    return raw.replace("\r", "").replace("\n", "").strip() or None


def _expand(path: str) -> str:
    return os.path.expandvars(os.path.expanduser(path))


def token_path(environ: Mapping[str, str]) -> str:
    """Where ``hf auth login`` keeps the token: HF_TOKEN_PATH, else $HF_HOME/token, else
    $XDG_CACHE_HOME/huggingface/token, else ~/.cache/huggingface/token (huggingface_hub constants.py)."""
    if environ.get("HF_TOKEN_PATH"):
        return _expand(environ["HF_TOKEN_PATH"])
    home = environ.get("HF_HOME") or os.path.join(environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"),
                                                  "huggingface")
    return os.path.join(_expand(home), "token")


def find_token(environ: Mapping[str, str] | None = None) -> HubToken | None:
    """The token huggingface_hub's ``get_token`` would use, looked up in its order (utils/_auth.py).

    HF_TOKEN, then HUGGING_FACE_HUB_TOKEN (``HF_TOKEN or HUGGING_FACE_HUB_TOKEN``,
    then cleaned: an HF_TOKEN of blanks hides the second and falls through to
    the file, as there), then the token file (:func:`token_path`). Not
    followed: the OIDC exchange (HF_OIDC_RESOURCE: a network call from CI)
    and Colab secrets. HF_HUB_DISABLE_IMPLICIT_TOKEN set true means no token,
    as ``build_hf_headers`` sends none then. A token file that exists but
    cannot be read is a :class:`HubError` naming it (huggingface_hub raises too).
    """
    env = os.environ if environ is None else environ
    if env.get("HF_HUB_DISABLE_IMPLICIT_TOKEN", "").upper() in ("1", "ON", "YES", "TRUE"):
        return None
    name = "HF_TOKEN" if env.get("HF_TOKEN") else "HUGGING_FACE_HUB_TOKEN"
    value = _clean_token(env.get("HF_TOKEN") or env.get("HUGGING_FACE_HUB_TOKEN"))
    if value is not None:
        return HubToken(value, name)
    path = token_path(env)
    try:
        with open(path, encoding="utf-8") as f:
            value = _clean_token(f.read())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise HubError(f"{path}: the Hub token file cannot be read ({exc.__class__.__name__})",
                       Ref(key="HF_TOKEN_PATH"), hint="fix its permissions, or set HF_TOKEN") from None
    return HubToken(value, path) if value is not None else None


@dataclass(frozen=True)
class ModelFetchReport:
    node: str
    repo_id: str
    revision: str
    commit: str
    local_dir: str
    files: int
    fetched: int
    skipped: int
    bytes: int
    seconds: float
    rate_Bps: float
    notices: tuple[str, ...] = ()  # e.g. a mirror that ignores ranges
    corrupt: tuple[str, ...] = ()  # files found different, deleted and fetched again
    retries: int = 0  # waits for the network or the Hub (a cut body, 429, 5xx), each one bounded
    resolved: int = 0  # storage URLs that expired mid-file and were asked of the Hub again


def resolve(
    inv: Inventory, transport: Transport, node: str, *, repo_id: str, revision: str, include: Sequence[str],
    exclude: Sequence[str], local_dir: str, endpoint: str, token: str | None, sudo: bool | None = None,
    token_from: str = "HF_TOKEN",
) -> HubPlan:
    """The plan of a fetch: which files of which commit, into where on ``node``, and whether they fit."""
    inv.node(node)
    push_agent(inv, transport, node, sudo=sudo)
    agent = Agent(inv, transport, sudo)
    dest = under(inv.node(node).prefix, local_dir)
    url = hub.revision_url(endpoint, repo_id, revision)
    cmd = agent.argv(node, "hub-info", "--dest", dest)
    res = transport.run(node, cmd, sudo=agent._sudo(node), timeout_s=INFO_TIMEOUT_S,
                        stdin=json.dumps({"url": url, "token": token}))
    evs = parse_events(res.stdout)
    info = next((e for e in evs if e.get("event") == "hub-info"), None)
    if info is None:
        why = next((e.get("message") for e in evs if e.get("event") == "error"), None) or res.describe()
        raise HubError(f"{node} could not reach {endpoint}: {why}", Ref(node=node),
                       hint="the fetching node needs HTTPS to the Hub (or HF_ENDPOINT naming a mirror it reaches)")
    status = int(info.get("status") or 0)
    if status != 200:
        raise hub.http_error(status, info.get("error_code"), info.get("error_message"), repo_id, revision,
                             token_set=bool(token), endpoint=endpoint, token_from=token_from)
    rev = hub.parse_revision(info.get("doc"), repo_id, revision)
    if rev.gated and not token:
        # the Hub lists a gated repository to anyone and refuses its files: say so before the first byte
        raise hub.http_error(401, "GatedRepo", None, repo_id, revision, token_set=False, endpoint=endpoint,
                             token_from=token_from)
    free = info.get("free_bytes")
    present = {str(k): int(v) for k, v in (info.get("present") or {}).items()}
    return hub.plan(node, endpoint, rev, include, exclude, dest, int(free) if free is not None else None, present)


def fetch_model(
    inv: Inventory, transport: Transport, plan: HubPlan, *, token: str | None, connections: int = 8,
    chunk_mb: float = 32.0, progress: ProgressCallback | None = None, poll_s: float = 1.0,
    sudo: bool | None = None, max_bytes: int | None = None, token_from: str = "HF_TOKEN",
    note: Callable[[str], None] | None = None,
) -> ModelFetchReport:
    """Download the plan's files on its node, verified; resumable by running it again.

    ``note`` hears each wait of the agent as it happens (a 429 with a
    Retry-After of minutes must not look like a hang). ``max_bytes`` is a
    test knob (the agent stops as if killed after that many bytes).
    """
    node = plan.node
    agent = Agent(inv, transport, sudo)
    args = ["hub-fetch", "--dest", plan.local_dir, "--connections", str(connections), "--chunk-mb", f"{chunk_mb:g}",
            "--hash-cache", hash_cache_path(inv, node)]
    if max_bytes is not None:
        args += ["--max-bytes", str(max_bytes)]
    spec = {"token": token, "files": hub.agent_files(plan), "manifest": hub.manifest(plan)}
    job, _ = agent.start(node, "hub-fetch", args, stdin=json.dumps(spec))
    notices: list[str] = []
    corrupt: list[str] = []
    waits = {"retry": 0, "resolved": 0}
    pace = Pace(poll_s)
    started = time.monotonic()
    try:
        while job.final is None:
            evs = agent.poll([job], wait_s=pace.take()).get(node, [])
            for ev in evs:
                if ev.get("event") == "notice":
                    notices.append(str(ev.get("message")))
                elif ev.get("event") == "corrupt":
                    corrupt.append(str(ev.get("file")))
                elif ev.get("event") in waits:
                    waits[str(ev["event"])] += 1
                    if note is not None:
                        note(str(ev.get("message")))
            report_progress(progress, node, "fetch", evs)
    except BaseException:
        agent.stop(node, job.pid)  # Ctrl-C here must not leave a download running beside the next attempt
        raise
    final = job.final
    rev = plan.revision
    if final.get("event") != "done":
        if final.get("status"):
            raise hub.http_error(int(final["status"]), final.get("error_code"), final.get("server_message"),
                                 rev.repo_id, rev.revision, token_set=bool(token), endpoint=plan.endpoint,
                                 token_from=token_from)
        hint = "run it again: complete files are kept and partial ones resume by chunk"
        raise WeightsError(f"{rev.repo_id}@{rev.commit[:12]} on {node}: {final.get('message')}", Ref(node=node),
                           hint=hint)
    return ModelFetchReport(
        node, rev.repo_id, rev.revision, rev.commit, plan.local_dir, int(final.get("files", 0)),
        int(final.get("fetched", 0)), int(final.get("skipped", 0)), int(final.get("bytes", 0)),
        float(final.get("seconds", time.monotonic() - started)), float(final.get("rate_Bps", 0.0)),
        tuple(dict.fromkeys(notices)), tuple(corrupt), waits["retry"], waits["resolved"],
    )
