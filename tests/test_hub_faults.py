"""weights fetch over a network that fails: cut bodies, 429/503, expiring storage URLs, and the token lookup.

The local hub (sparkctl_sim/hub.py) is told a fault; sparkctl's fetch (the
agent on a LocalTransport "node", as in test_hub.py) must end with the same
bytes and no traceback. The official client (huggingface_hub's
``hf_hub_download``) is run against the same hub and the same faults: first
it must accept the hub at all (the judge of the protocol), then the test
records what it does with each fault, which is the reference sparkctl's
behaviour is compared with in docs/weights.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sparkctl.ops import hub
from sparkctl.ops.hub import HubError
from sparkctl.ops.hubfetch import HubToken, find_token, token_path
from sparkctl.remote import weights_agent as agent
from sparkctl_sim.hub import LocalHub, http_date, make_repo

from helpers import FILES, REPO_ID, TOKEN, fetch, tree

AGENT = Path(agent.__file__)
BIG = "model-00001-of-00002.safetensors"  # 700 KiB: six 128 KiB chunks
BIG_SHA = hashlib.sha256(FILES[BIG]).hexdigest()


@pytest.fixture
def local_hub() -> Iterator[LocalHub]:
    with LocalHub([make_repo(REPO_ID, FILES)], tokens={TOKEN: {REPO_ID}}) as h:
        yield h


# --------------------------------------------------------------------------- Retry-After and backoff (pure)


@pytest.mark.parametrize("value, want", [
    ("120", 120.0), (" 7 ", 7.0), ("0", 0.0),
    ("Wed, 21 Oct 2015 07:28:00 GMT", 30.0),  # an HTTP-date, 30 s after "now" below
    ("Wed, 21 Oct 2015 07:27:00 GMT", 0.0),  # a date past: at once
    ("Wednesday, 21-Oct-15 07:28:00 GMT", 30.0),  # RFC 850, which RFC 9110 says a recipient must accept
    ("", None), (None, None), ("soon", None), ("-5", None), ("1.5", None),
])
def test_retry_after_is_read_in_both_forms(value: str | None, want: float | None) -> None:
    now = 1445412450.0  # Wed, 21 Oct 2015 07:27:30 GMT
    got = agent.parse_retry_after(value, now)
    assert got == pytest.approx(want) if want is not None else got is None


def test_waits_honour_the_server_capped_else_back_off_doubling() -> None:
    def headers(**h: str) -> Callable[[str], str | None]:
        return lambda name: h.get(name.replace("-", "_"))

    assert [agent.backoff_s(i) for i in range(6)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]  # huggingface_hub's 1 s .. 8 s
    assert agent.wait_before_retry(503, headers(), 2) == (4.0, "backoff")
    assert agent.wait_before_retry(503, headers(Retry_After="3"), 2) == (3.0, "Retry-After")
    assert agent.wait_before_retry(429, headers(Retry_After="86400"), 0) == (agent.RETRY_AFTER_MAX_S, "Retry-After")
    # the Hub's own header on a 429 wins, when nothing remains in the window (huggingface_hub does the same)
    assert agent.wait_before_retry(429, headers(RateLimit='"resolvers";r=0;t=55', Retry_After="3"), 0) == \
        (55.0, "RateLimit")
    assert agent.wait_before_retry(429, headers(RateLimit='"api";r=12;t=55'), 1) == (2.0, "backoff")
    assert agent.wait_before_retry(503, headers(RateLimit='"api";r=0;t=55'), 0) == (1.0, "backoff")


def test_patience_is_bounded_renewed_by_progress_and_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    monkeypatch.setattr(agent, "BACKOFF_FIRST_S", 0.0)
    events: list[dict] = []
    p = agent.Patience("model.safetensors", threading.Event(), lambda ev, **f: events.append({"event": ev, **f}),
                       retries=2)
    p.wait("HTTP 503")
    p.wait("HTTP 503")
    p.progress()  # bytes came in: two more waits
    p.wait("network: cut")
    p.wait("network: cut")
    with pytest.raises(agent.AgentError, match=r"model.safetensors: HTTP 503 \(gave up after 3 tries in a row\)"):
        p.wait("HTTP 503")
    assert [e["event"] for e in events] == ["retry"] * 4 and "trying again" in events[0]["message"]
    short = agent.Patience("listing", threading.Event(), max_total_s=30)
    with pytest.raises(agent.AgentError, match="asks to wait 300 s"):
        short.wait("HTTP 429", 429, lambda n: "600" if n == "Retry-After" else None)


# --------------------------------------------------------------------------- the token, where huggingface_hub finds it


def _hf_get_token(env: dict[str, str]) -> str | None:
    """What the installed huggingface_hub's ``get_token`` answers in this environment (a fresh process:
    its constants read the environment at import)."""
    code = "from huggingface_hub.utils import get_token; import json; print(json.dumps(get_token()))"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    r = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


@pytest.mark.parametrize("case", ["hf_token", "legacy", "both", "blank_hf_token", "hf_home", "token_path", "xdg",
                                  "none", "disabled", "empty_file"])
def test_token_found_where_huggingface_hub_finds_it(case: str, tmp_path: Path) -> None:
    home = tmp_path / "hf"
    home.mkdir()
    env: dict[str, str] = {"HOME": str(tmp_path / "home"), "HF_HOME": str(home)}
    (home / "token").write_text("hf_from_home_file\n")
    want_from = str(home / "token")
    if case == "hf_token":
        env["HF_TOKEN"], want_from = " hf_env \n", "HF_TOKEN"
    elif case == "legacy":
        env["HUGGING_FACE_HUB_TOKEN"], want_from = "hf_legacy", "HUGGING_FACE_HUB_TOKEN"
    elif case == "both":
        env.update(HF_TOKEN="hf_env", HUGGING_FACE_HUB_TOKEN="hf_legacy")
        want_from = "HF_TOKEN"
    elif case == "blank_hf_token":  # "HF_TOKEN or HUGGING_FACE_HUB_TOKEN", then cleaned: blanks hide the second
        env.update(HF_TOKEN="  ", HUGGING_FACE_HUB_TOKEN="hf_legacy")
    elif case == "token_path":
        (tmp_path / "elsewhere").write_text("hf_from_token_path")
        env["HF_TOKEN_PATH"], want_from = str(tmp_path / "elsewhere"), str(tmp_path / "elsewhere")
    elif case == "xdg":
        del env["HF_HOME"]
        (tmp_path / "xdg" / "huggingface").mkdir(parents=True)
        (tmp_path / "xdg" / "huggingface" / "token").write_text("hf_xdg")
        env["XDG_CACHE_HOME"], want_from = str(tmp_path / "xdg"), str(tmp_path / "xdg" / "huggingface" / "token")
    elif case == "none":
        (home / "token").unlink()
    elif case == "disabled":
        env.update(HF_TOKEN="hf_env", HF_HUB_DISABLE_IMPLICIT_TOKEN="1")
    elif case == "empty_file":
        (home / "token").write_text("\n")
    got = find_token(env)
    hf = _hf_get_token(env)
    if case == "disabled":
        # get_token still answers; build_hf_headers sends nothing: the token a download would use is none
        assert got is None and hf == "hf_env"
        return
    assert (got.value if got else None) == hf
    if got is not None:
        assert got.source == want_from and got.value not in repr(got)
    else:
        assert case in ("none", "empty_file")


def test_token_path_defaults_to_the_cache_under_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert token_path({}) == str(tmp_path / ".cache" / "huggingface" / "token")
    assert token_path({"HF_HOME": "~/hf"}) == str(tmp_path / "hf" / "token")


def test_an_unreadable_token_file_is_named_not_ignored(tmp_path: Path) -> None:
    (tmp_path / "token").mkdir()  # a directory where the file should be
    with pytest.raises(HubError, match="token file cannot be read"):
        find_token({"HF_HOME": str(tmp_path)})


def test_a_refused_token_names_where_it_was_found() -> None:
    e = hub.http_error(403, "GatedRepo", None, "o/m", "main", token_set=True, endpoint="http://h",
                       token_from="/home/op/.cache/huggingface/token")
    assert "the token in /home/op/.cache/huggingface/token has no access" in e.one_line()
    assert "HF_TOKEN has no access" in hub.http_error(403, "GatedRepo", None, "o/m", "main", token_set=True,
                                                      endpoint="http://h").one_line()
    assert HubToken("hf_secret", "HF_TOKEN").__repr__().count("hf_secret") == 0


# --------------------------------------------------------------------------- sparkctl through each fault


def _faults() -> dict[str, Callable[[LocalHub], None]]:
    return {
        # the connection drops in the middle of a chunk, of the 1-byte probe, of a small file, of the listing
        "cut mid-chunk": lambda h: h.cut_body(50_000, times=3, path=BIG_SHA),
        "cut at byte 0": lambda h: h.cut_body(0, times=2),
        "cut a small file": lambda h: h.cut_body(3, server="hub", path="config.json"),
        "cut the listing": lambda h: h.cut_body(100, server="hub", path="/api/"),
        "429 Retry-After seconds": lambda h: h.refuse(429, 2, retry_after=1),
        "503 Retry-After date": lambda h: h.refuse(503, 1, retry_after=http_date(1)),
        "503 no Retry-After": lambda h: h.refuse(503, 2),
        "429 RateLimit": lambda h: h.refuse(429, 1, ratelimit_reset_s=1),
        "hub 503 on resolve": lambda h: h.refuse(503, 1, server="hub", path="/resolve/"),
        "hub 429 on the listing": lambda h: h.refuse(429, 1, server="hub", path="/api/", retry_after=1),
    }


@pytest.mark.parametrize("fault", list(_faults()))
def test_sparkctl_fetch_through_a_fault_ends_byte_identical(fault: str, local_hub: LocalHub, tmp_path: Path) -> None:
    _faults()[fault](local_hub)
    _, rep = fetch(tmp_path, local_hub)
    assert local_hub.faults_served, "the fault was never served: the test would prove nothing"
    assert tree(tmp_path / "a" / "models" / "m") == FILES
    assert rep.fetched == len(FILES)
    if "listing" not in fault:  # (the listing is read in one command, before the job)
        assert rep.retries >= 1  # the operator was told of every wait
    if fault == "cut mid-chunk":
        # resumed from the byte it had, not from the chunk's start
        starts = [int(r[6:].split("-")[0]) for r in local_hub.storage_gets(BIG_SHA) if r and r != "bytes=0-0"]
        assert any(s % (128 * 1024) == 50_000 for s in starts), starts


def test_an_expired_storage_url_is_resolved_again_from_the_hub(tmp_path: Path) -> None:
    # URLs good for 1 to 2 s (whole seconds, as CloudFront's Expires), and a link slow enough that the big
    # file's 4th chunk starts after 3 chunks passed it: 384 KiB at 150 kB/s, over 2.6 s
    with LocalHub([make_repo(REPO_ID, FILES)], tokens={TOKEN: {REPO_ID}}, url_ttl_s=1, rate_Bps=150_000) as h:
        _, rep = fetch(tmp_path, h)
        assert h.expired, "no URL expired: the test would prove nothing"
        assert rep.resolved >= 1 and h.storage_saw_token == 0
    assert tree(tmp_path / "a" / "models" / "m") == FILES


def test_a_job_stopped_mid_chunk_asks_the_next_run_for_the_rest_of_that_chunk_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chunk = 512 * 1024
    # a connection reads 64 KiB at a time here: a stop after 100 kB lands inside the first chunk, at 128 KiB
    monkeypatch.setattr(agent, "RECV_BUF", 64 * 1024)
    with LocalHub([make_repo(REPO_ID, FILES)]) as h:
        url = hub.resolve_url(h.endpoint, REPO_ID, "main", BIG)
        dest = tmp_path / "x"
        quiet = agent.Emitter(open(os.devnull, "w"))
        with pytest.raises(agent.Interrupted):
            agent.fetch_file(url, str(dest), emit=quiet, connections=1, chunk_bytes=chunk, sha256=BIG_SHA,
                             max_bytes=100_000)
        side = json.loads((tmp_path / "x.part.json").read_text())
        kept = {int(i): n for i, n in side["partial"].items()}
        assert side["done"] == [] and kept == {0: 128 * 1024}, side
        before = len(h.storage_gets(BIG_SHA))
        res = agent.fetch_file(url, str(dest), emit=quiet, connections=2, chunk_bytes=chunk, sha256=BIG_SHA)
        asked = h.storage_gets(BIG_SHA)[before:]
    assert dest.read_bytes() == FILES[BIG] and not (tmp_path / "x.part.json").exists()
    assert f"bytes={kept[0]}-{chunk - 1}" in asked, asked  # from the byte on disk, not the chunk's start
    assert res["bytes"] == len(FILES[BIG]) - kept[0] and res["resumed_bytes"] == kept[0]


def test_a_fault_that_does_not_pass_fails_the_file_with_its_name_and_no_traceback(
        local_hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    local_hub.refuse(503, times=1000, path=BIG_SHA)
    spec = {"token": None, "files": [{"path": BIG, "url": hub.resolve_url(local_hub.endpoint, REPO_ID, "main", BIG),
                                      "size": len(FILES[BIG]), "sha256": BIG_SHA, "blob_id": None}],
            "manifest": {"files": {BIG: {}}}}
    monkeypatch.setattr(agent, "BACKOFF_FIRST_S", 0.01)
    events: list[dict] = []
    with pytest.raises(agent.HubFailed) as e:
        agent.hub_fetch(spec, str(tmp_path / "d"), emit=lambda ev, **f: events.append({"event": ev, **f}), token=None,
                        connections=2, chunk_bytes=128 * 1024, cache=agent.HashCache(None))
    assert f"{BIG}: HTTP 503 Service Unavailable (gave up after {agent.RETRIES + 1} tries in a row)" in str(e.value)
    assert sum(ev["event"] == "retry" for ev in events) == agent.RETRIES


def test_the_agent_never_prints_a_traceback_even_for_the_unforeseen(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(AGENT), "hub-fetch", "--dest", str(tmp_path)], input="{not json",
                       capture_output=True, text=True, timeout=60)
    last = json.loads(r.stdout.splitlines()[-1])
    assert r.returncode == agent.EXIT_ERROR and last["event"] == "error" and "JSONDecodeError" in last["message"]
    assert "Traceback" not in r.stdout + r.stderr


# --------------------------------------------------------------------------- the official client, same hub, same faults


def _official(h: LocalHub, dest: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """``hf_hub_download`` of the big shard against ``h``: ("ok", "") with the right bytes, or ("fail", why)."""
    from huggingface_hub import hf_hub_download

    try:
        p = hf_hub_download(REPO_ID, BIG, local_dir=str(dest), endpoint=h.endpoint, token=TOKEN)
    except Exception as exc:  # noqa: BLE001 - what it raises is the finding
        return "fail", f"{exc.__class__.__name__}: {str(exc).splitlines()[0]}"
    assert Path(p).read_bytes() == FILES[BIG]
    return "ok", ""


# What huggingface_hub 2.4 does with each fault (file_download.py http_get: resumes a cut body with
# Range and retries 408/429 on the GET only; utils/_http.py: the HEAD to /resolve/ retries 5xx too;
# the storage URL is the one the HEAD got, never asked for again).
OFFICIAL = {
    "cut mid-body": ("ok", lambda h: h.cut_body(100_000, path=BIG_SHA)),
    "429 Retry-After": ("ok", lambda h: h.refuse(429, 1, retry_after=1, path=BIG_SHA)),
    "503 on the storage GET": ("fail", lambda h: h.refuse(503, 1, path=BIG_SHA)),
    "503 on the /resolve/ HEAD": ("ok", lambda h: h.refuse(503, 1, server="hub", path="/resolve/")),
}


@pytest.mark.parametrize("fault", list(OFFICIAL))
def test_official_client_with_the_same_fault(fault: str, local_hub: LocalHub, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    want, set_fault = OFFICIAL[fault]
    assert _official(local_hub, tmp_path / "clean", monkeypatch) == ("ok", "")  # the hub is accepted as is
    set_fault(local_hub)
    got, why = _official(local_hub, tmp_path / "faulty", monkeypatch)
    assert local_hub.faults_served
    assert got == want, why
    if got == "fail":
        assert "503" in why


def test_official_client_fails_on_an_expired_storage_url_where_sparkctl_resolves_it_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a cut after the URL expired: 100 kB at 100 kB/s is over 1 s, more than a 0.2 s URL lives (at most
    # 1.2 s: whole seconds), and http_get sleeps 1 s more, then resumes on the same, expired, URL
    with LocalHub([make_repo(REPO_ID, FILES)], tokens={TOKEN: {REPO_ID}}, url_ttl_s=0.2, rate_Bps=100_000) as h:
        h.cut_body(100_000, path=BIG_SHA)
        got, why = _official(h, tmp_path / "hf", monkeypatch)
        assert h.expired and got == "fail" and "403" in why


def test_a_job_that_dies_without_a_result_says_its_last_words() -> None:
    from sparkctl.ops.agentjobs import Job, absorb

    job = Job("spark-a", "hub-fetch", "/x.log", 42)
    absorb(job, [{"event": "log", "text": "MemoryError: killed"}, {"event": "tail", "offset": 9, "alive": False}])
    assert job.final is not None and job.final["event"] == "error"
    assert job.final["message"] == "the hub-fetch job (pid 42) ended without a result; its last words: MemoryError: killed"
