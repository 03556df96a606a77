"""weights fetch PROFILE: the Hub protocol, judged by the official client, on a local hub.

The local hub (sparkctl_sim/hub.py) is first checked against
``huggingface_hub.snapshot_download``; then sparkctl's fetch (the agent on a
LocalTransport "node") must give the same tree byte for byte, resume, repair,
and refuse bad input with one line and a hint.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkctl.ops import hub
from sparkctl.ops.hub import HubError
from sparkctl.remote import weights_agent as agent
from sparkctl.transport import LocalTransport
from sparkctl_sim.hub import LocalHub, make_repo

from helpers import FILES, KIB, REPO_ID, TOKEN, blob, fetch, tree


@pytest.fixture
def local_hub() -> Iterator[LocalHub]:
    repos = [make_repo(REPO_ID, FILES), make_repo("org/gated", {"a.safetensors": blob(1000, 5)}, gated=True),
             make_repo("org/private", {"a.safetensors": blob(1000, 6)}, private=True)]
    with LocalHub(repos, tokens={TOKEN: {REPO_ID, "org/gated", "org/private"}, "hf_other": {REPO_ID}}) as h:
        yield h


# --------------------------------------------------------------------------- the judge


def test_official_client_and_sparkctl_fetch_byte_identical_trees(local_hub: LocalHub, tmp_path: Path) -> None:
    from huggingface_hub import snapshot_download

    plan, rep = fetch(tmp_path, local_hub)
    ranges = local_hub.storage_gets(hashlib.sha256(FILES["model-00001-of-00002.safetensors"]).hexdigest())
    ref = tmp_path / "hf"
    snapshot_download(REPO_ID, revision="main", local_dir=str(ref), endpoint=local_hub.endpoint, token=TOKEN)
    got = tmp_path / "a" / "models" / "m"
    assert tree(got) == tree(ref) == {k: v for k, v in FILES.items()}
    assert rep.commit == plan.revision.commit and rep.fetched == len(FILES) and rep.skipped == 0
    man = json.loads((got / hub.MANIFEST_REL).read_text())
    assert man["repo_id"] == REPO_ID and man["commit"] == rep.commit
    assert {k: v["sha256"] for k, v in man["files"].items()} == {k: hashlib.sha256(v).hexdigest()
                                                               for k, v in FILES.items()}
    # the LFS shards were fetched in ranges from the storage host, keeping Range across the redirect
    assert len(ranges) > 3 and all(r and r.startswith("bytes=") for r in ranges)
    # the token never reached the storage host (requests/httpx drop it across hosts; so must we)
    assert local_hub.storage_saw_token == 0


def test_rerun_skips_complete_files_and_a_corrupted_shard_is_named_deleted_and_fetched_again(
        local_hub: LocalHub, tmp_path: Path) -> None:
    _, first = fetch(tmp_path, local_hub)
    shard = tmp_path / "a" / "models" / "m" / "model-00002-of-00002.safetensors"
    before = len(local_hub.requests)
    _, again = fetch(tmp_path, local_hub)
    assert again.fetched == 0 and again.skipped == first.files and again.bytes == 0
    assert not [r for r in local_hub.requests[before:] if "/resolve/" in r[2] or r[0] == "storage"]
    data = bytearray(shard.read_bytes())
    data[1000] ^= 0xFF
    shard.write_bytes(bytes(data))
    _, fixed = fetch(tmp_path, local_hub)
    assert fixed.corrupt == ("model-00002-of-00002.safetensors",) and fixed.fetched == 1
    assert shard.read_bytes() == FILES["model-00002-of-00002.safetensors"]


def test_an_interrupted_fetch_resumes_by_chunk(local_hub: LocalHub, tmp_path: Path) -> None:
    with pytest.raises(Exception, match="stopped after") as e:
        fetch(tmp_path, local_hub, max_bytes=400 * KIB)
    assert "run it again" in (getattr(e.value, "hint", "") or "")
    big = hashlib.sha256(FILES["model-00001-of-00002.safetensors"]).hexdigest()
    n_first = len(local_hub.storage_gets(big))
    _, rep = fetch(tmp_path, local_hub)
    assert tree(tmp_path / "a" / "models" / "m") == FILES
    n_chunks = -(-len(FILES["model-00001-of-00002.safetensors"]) // (128 * KIB))
    # the second run asked only for the chunks the first did not finish (+1 probe of byte 0)
    assert len(local_hub.storage_gets(big)) - n_first < n_chunks + 1
    assert rep.bytes < sum(len(v) for v in FILES.values())


def test_default_patterns_take_a_safetensors_checkpoint_and_leave_duplicates(local_hub: LocalHub,
                                                                              tmp_path: Path) -> None:
    from sparkctl.model.schema import DEFAULT_MODEL_EXCLUDE, DEFAULT_MODEL_INCLUDE

    plan, _ = fetch(tmp_path, local_hub, include=list(DEFAULT_MODEL_INCLUDE), exclude=list(DEFAULT_MODEL_EXCLUDE))
    assert [f.path for f in plan.files] == sorted(set(FILES) - {"pytorch_model.bin", "original/consolidated.00.pth"})
    assert plan.free_bytes is not None and plan.free_bytes > 0
    lines = hub.describe(plan)
    assert "6 files" in lines[-1] and "free on a" in lines[-1]


def test_a_mirror_that_ignores_ranges_falls_back_to_one_stream_and_says_so(tmp_path: Path) -> None:
    with LocalHub([make_repo(REPO_ID, FILES)], no_ranges=True) as h:
        _, rep = fetch(tmp_path, h, token=None)
    assert tree(tmp_path / "a" / "models" / "m") == FILES
    assert any("ignores Range" in n for n in rep.notices)


def test_drops_written_pages_as_it_goes(local_hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(agent, "FLUSH_BYTES", 256 * KIB)
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, off, n, advice: calls.append((off, n)))
    url = hub.resolve_url(local_hub.endpoint, REPO_ID, "main", "model-00001-of-00002.safetensors")
    data = FILES["model-00001-of-00002.safetensors"]
    agent.fetch_file(url, str(tmp_path / "x"), emit=agent.Emitter(open(os.devnull, "w")), connections=2,
                     chunk_bytes=64 * KIB, sha256=hashlib.sha256(data).hexdigest(), drop_cache=True)
    assert (tmp_path / "x").read_bytes() == data
    assert len(calls) >= 2 and calls[-1] == (0, 0)  # during the download, then the whole file after the fsync


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("repo_id, token, revision, want, hint", [
    ("org/nope", TOKEN, "main", "repository org/nope not found", "check model.id"),
    (REPO_ID, TOKEN, "v9", "revision 'v9' of org/model not found", "model.revision"),
    ("org/gated", None, "main", "gated or private and no token", "set HF_TOKEN"),
    ("org/private", None, "main", "gated or private and no token", "set HF_TOKEN"),
    ("org/gated", "hf_other", "main", "HF_TOKEN has no access", "accept the conditions"),
])
def test_refusals_are_one_line_with_a_hint(local_hub: LocalHub, tmp_path: Path, repo_id: str, token: str | None,
                                           revision: str, want: str, hint: str) -> None:
    with pytest.raises(HubError) as e:
        fetch(tmp_path, local_hub, repo_id, token=token, revision=revision)
    assert want in e.value.one_line() and hint in (e.value.hint or "")
    assert "\n" not in e.value.one_line() and TOKEN not in str(e.value) + (e.value.hint or "")


def test_a_disk_that_cannot_hold_the_model_is_refused_before_downloading(local_hub: LocalHub) -> None:
    rev = hub.parse_revision({"sha": "c" * 40, "siblings": [
        {"rfilename": "a.safetensors", "size": 5 * 2**30, "lfs": {"sha256": "a" * 64, "size": 5 * 2**30}},
        {"rfilename": "config.json", "size": 10, "blobId": "b" * 40}]}, "o/m", "main")
    with pytest.raises(HubError, match=r"has 1.00 GiB free, the model needs 5.00 GiB more") as e:
        hub.plan("spark-a", "http://h", rev, ["*"], [], "/srv/m", 2**30, {})
    assert "free space" in (e.value.hint or "")
    ok = hub.plan("spark-a", "http://h", rev, ["*"], [], "/srv/m", 2**30, {"a.safetensors": 5 * 2**30})
    assert ok.needed_bytes == 10


def test_unsafe_paths_and_unreadable_answers_are_refused() -> None:
    for doc in ({"sha": "x", "siblings": [{"rfilename": "../etc/passwd", "size": 1}]}, {"siblings": []}, [1]):
        with pytest.raises(HubError, match="unreadable"):
            hub.parse_revision(doc, "o/m", "main")


def test_select_follows_huggingface_hub_patterns() -> None:
    from huggingface_hub.utils import filter_repo_objects

    files = [hub.HubFile(p, 1, None, None) for p in FILES]
    for inc, exc in ((["*.json"], []), (["*"], ["original/"]), (["tokenizer/*", "*.jinja"], ["*.bin"])):
        want = list(filter_repo_objects(list(FILES), allow_patterns=inc, ignore_patterns=exc))
        assert sorted(f.path for f in hub.select(files, inc, exc)) == sorted(want)


def _cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], endpoint: str,
         token: str | None, *args: str) -> tuple[int, str]:
    """``sparkctl weights fetch`` in-process, its nodes local (a LocalTransport under each node's prefix)."""
    import sparkctl.cli.weights as cli_weights
    from sparkctl.cli.main import main

    inv = tmp_path / "inv.yaml"
    inv.write_text("cluster: {name: t, fabric_pool: 127.23.0.0/16}\ndefaults: {sudo: false}\nnodes:\n"
                   f"  - {{name: spark-a, host: 192.0.2.1, prefix: {tmp_path / 'a'}}}\n")
    monkeypatch.setattr(cli_weights, "make_transport", lambda inv, *a: LocalTransport(inv.names, sudo=False))
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no token file of this machine's
    for name in ("HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HF_HUB_DISABLE_IMPLICIT_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    if token:
        monkeypatch.setenv("HF_TOKEN", token)
    else:
        monkeypatch.delenv("HF_TOKEN", raising=False)
    code = main(["-i", str(inv), "weights", "fetch", "tiny-llamacpp", *args])
    got = capsys.readouterr()
    return code, got.out + got.err


def test_cli_fetches_the_tiny_profile_and_refuses_without_a_traceback_or_the_token(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("gguf")
    from sparkctl_sim.hub import tiny_repo

    tiny = tiny_repo()
    with LocalHub([tiny, make_repo("sparkctl/other", {"x.gguf": b"x"})], tokens={"hf_other": {"sparkctl/other"}}) as h:
        code, text = _cli(tmp_path, monkeypatch, capsys, h.endpoint, None, "--dry-run")
        assert code == 0 and "tiny-llama.gguf" in text and "3 files" in text and "free on spark-a" in text
        code, text = _cli(tmp_path, monkeypatch, capsys, h.endpoint, None)
        assert code == 0, text
        got = tmp_path / "a" / "srv" / "models" / "tiny-llama"
        assert (got / "tiny-llama.gguf").read_bytes() == tiny.files["tiny-llama.gguf"].data
        assert json.loads((got / hub.MANIFEST_REL).read_text())["commit"] == tiny.commit
        code, text = _cli(tmp_path, monkeypatch, capsys, h.endpoint, "hf_other", "--revision", "nope")
        assert code != 0 and "Traceback" not in text and "hf_other" not in text
        assert "revision 'nope' of sparkctl/tiny-llama not found" in text and len(text.strip().splitlines()) <= 3
    with LocalHub([make_repo("x/y", {"a": b"a"})]) as h:
        code, text = _cli(tmp_path, monkeypatch, capsys, h.endpoint, None)
        assert code != 0 and "repository sparkctl/tiny-llama not found" in text and "Traceback" not in text
