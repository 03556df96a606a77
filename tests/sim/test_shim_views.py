"""The SIMULATED tools' rendered views (sparkctl_sim/shims/rendered.py) answer exactly what the
Python shims answer, follow every state write, and fall back to Python for anything else."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from sparkctl_sim import nodestate, shims
from sparkctl_sim.shims import rendered


@pytest.fixture
def node(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    state = tmp_path / "node" / "state.json"
    nodestate.create(state, nodestate.default_state("spark-a"))
    shims.install_shims(tmp_path / "bin", state_path=state)
    env = {k: v for k, v in os.environ.items() if k not in (shims.STATE_ENV, "PYTHONPATH")}
    return tmp_path / "bin", env


def _run(bin_dir: Path, env: dict[str, str], *argv: str) -> tuple[str, str, int]:
    r = subprocess.run([str(bin_dir / argv[0]), *argv[1:]], capture_output=True, text=True, env=env, timeout=60)
    return r.stdout, r.stderr, r.returncode


def _python(env: dict[str, str], state: Path, *argv: str) -> tuple[str, str, int]:
    root = str(Path(shims.__file__).resolve().parents[2])
    r = subprocess.run(["python3", "-S", "-m", "sparkctl_sim.shims", *argv], capture_output=True, text=True,
                       env={**env, shims.STATE_ENV: str(state), "PYTHONPATH": root}, timeout=60)
    return r.stdout, r.stderr, r.returncode


CASES = [(tool, args) for tool, lines in rendered.TABLE.items() for args in lines
         if (tool, args) not in rendered.LINK_ARG]  # carrier views need the node's sysfs (e2e)


@pytest.mark.parametrize(("tool", "args"), CASES, ids=[f"{t} {' '.join(a)}" for t, a in CASES])
def test_the_view_is_the_python_shims_answer(node: tuple[Path, dict[str, str]], tool: str,
                                              args: tuple[str, ...]) -> None:
    bin_dir, env = node
    state = bin_dir.parent / "node" / "state.json"
    assert _run(bin_dir, env, tool, *args) == _python(env, state, tool, *args)


def test_the_wrapper_sources_the_view_and_python_never_starts(node: tuple[Path, dict[str, str]]) -> None:
    bin_dir, env = node
    view = bin_dir.parent / "node" / rendered.VIEWS_DIR / "uname.1.sh"
    assert view.read_text() == "printf %s '6.17.0-1029-nvidia\n'\nexit 0\n"
    # a planted view is what the tool prints: the wrapper read it, no Python computed it
    view.write_text("printf %s 'planted\n'\nexit 3\n")
    assert _run(bin_dir, env, "uname", "-r") == ("planted\n", "", 3)
    view.unlink()  # no view: the Python shim answers
    assert _run(bin_dir, env, "uname", "-r") == ("6.17.0-1029-nvidia\n", "", 0)


def test_every_state_write_renders_the_views_again(node: tuple[Path, dict[str, str]]) -> None:
    bin_dir, env = node
    state = bin_dir.parent / "node" / "state.json"
    with nodestate.edit(state) as s:
        s["kernel_release"] = "6.17.0-1031-nvidia"
        s["packages"] = {"earlyoom": "1.7-1"}
        s["pcie"]["width"] = 2
    assert _run(bin_dir, env, "uname", "-r")[0] == "6.17.0-1031-nvidia\n"
    assert _run(bin_dir, env, "dpkg-query", "-W", "--showformat=${db:Status-Status}", "earlyoom") == \
        ("installed", "", 0)
    lspci = _run(bin_dir, env, "lspci", "-vv", "-s", "0000:01:00.0")[0]
    assert ("Width x2 (downgraded)" if os.geteuid() == 0 else "<access denied>") in lspci
    out = _run(bin_dir, env, "apt-mark", "hold", "linux-nvidia-hwe-24.04")  # a mutator: always Python
    assert out[2] in (0, 100)


def test_arguments_outside_the_table_go_to_python(node: tuple[Path, dict[str, str]]) -> None:
    bin_dir, env = node
    assert _run(bin_dir, env, "uname", "-sr") == ("Linux 6.17.0-1029-nvidia\n", "", 0)
    out, err, rc = _run(bin_dir, env, "uname", "-Z")
    assert rc == 1 and "invalid option -- 'Z'" in err


def _ps_pids(out: str, but: str = "@") -> set[int]:
    return {int(line.split()[0]) for line in out.strip().splitlines()[1:] if but not in line}


@pytest.mark.needs_root
def test_ps_keeps_the_rows_of_its_own_network_namespace_without_python(node: tuple[Path, dict[str, str]]) -> None:
    """In a new network namespace (a node of its own) the sh ``ps`` lists only that namespace's processes
    (the shell, a sleeper and the wrapper itself), not this test's, and no Python starts for it."""
    bin_dir, env = node
    if os.geteuid() != 0:
        pytest.skip("unshare -n needs root")
    state = bin_dir.parent / "node" / "state.json"
    (bin_dir.parent / "probe.sh").write_text(  # a file: its sh's row shows no command line
        f"sleep 30 & s=$!; {bin_dir}/ps -eo pid,args; echo \"@$$ $s\"; kill $s\n")
    r = subprocess.run(["unshare", "-n", "sh", str(bin_dir.parent / "probe.sh")], capture_output=True, text=True,
                       env={**env, shims.STATE_ENV: str(state)}, timeout=60)
    fast, tail = r.stdout.split("@")
    assert "python" not in fast and f"{bin_dir}/ps -eo pid,args" in fast
    assert _ps_pids(fast, but=f"{bin_dir}/ps") == {int(x) for x in tail.split()}
    assert os.getpid() not in _ps_pids(fast)  # the test's own process is in another namespace


def test_ps_settles_a_dead_engines_memory(node: tuple[Path, dict[str, str]]) -> None:
    """An engine gone without giving its memory back: the wrapper has Python settle the node's
    memory (nodestate.settle) before it lists; with every engine alive, nothing is settled."""
    bin_dir, env = node
    state = bin_dir.parent / "node" / "state.json"
    dead = subprocess.Popen(["true"])
    dead.wait()
    with nodestate.edit(state) as s:
        s["engine_mem_gib"] = {str(os.getpid()): 10.0, str(dead.pid): 20.0}
    assert (state.parent / nodestate.ENGINE_PIDS).read_text() == f"{os.getpid()} {dead.pid}\n"
    _run(bin_dir, env, "ps", "-p", "1")
    assert nodestate.load(state)["engine_mem_gib"] == {str(os.getpid()): 10.0}
    _run(bin_dir, env, "ps", "-p", "1")  # the live one stays
    assert nodestate.load(state)["engine_mem_gib"] == {str(os.getpid()): 10.0}


@pytest.mark.parametrize("k", range(len(rendered.SMI_LINES)))
def test_nvidia_smis_query_views_are_the_python_shims_answer_of_that_second(node: tuple[Path, dict[str, str]],
                                                                            k: int) -> None:
    """The per-second views of sparkctl's nvidia-smi query lines: idle and busy (an engine holds memory,
    the clocks and power jitter per second), the wrapper's answer is Python's in the same second."""
    bin_dir, env = node
    state = bin_dir.parent / "node" / "state.json"
    args = rendered.SMI_LINES[k]
    for busy in (False, True):
        if busy:
            with nodestate.edit(state) as s:
                s["engine_mem_gib"] = {str(os.getpid()): 30.0}
        for _ in range(3):  # a pair that straddles a second boundary may differ: try again
            a, b = _run(bin_dir, env, "nvidia-smi", *args), _python(env, state, "nvidia-smi", *args)
            if a == b:
                break
        assert a == b and a[2] == 0
        views = sorted(p.name for p in (state.parent / rendered.VIEWS_DIR).glob(f"nvidia-smi.{k}.*.sh"))
        assert len(views) >= rendered.SMI_WINDOW_S


def test_nvidia_smis_views_run_out_and_python_renders_the_next_ones(node: tuple[Path, dict[str, str]]) -> None:
    bin_dir, env = node
    views = bin_dir.parent / "node" / rendered.VIEWS_DIR
    for f in views.glob("nvidia-smi.*.sh"):
        f.unlink()  # as if the window ran out
    out = _run(bin_dir, env, "nvidia-smi", *rendered.SMI_LINES[0])
    assert out[2] == 0 and out[0].startswith("NVIDIA GB10, 12.1, ")
    assert len(list(views.glob("nvidia-smi.0.*.sh"))) == rendered.SMI_WINDOW_S
    # a planted view for this second is what the wrapper prints: no Python computed it
    import time

    now = int(time.time())
    for sec in (now, now + 1, now + 2):
        (views / f"nvidia-smi.0.{sec}.sh").write_text("printf %s 'planted\n'\nexit 0\n")
    assert _run(bin_dir, env, "nvidia-smi", *rendered.SMI_LINES[0])[0] == "planted\n"


@pytest.mark.parametrize("store", ["classic", "containerd"])
def test_docker_info_is_a_view_of_the_image_store_kind(tmp_path: Path, store: str) -> None:
    """``docker info --format '{{json .DriverStatus}}'`` (sparkctl's store probe) from the node's views:
    the answer of the Python docker shim, for either image store; it follows a state write."""
    from sparkctl_sim import procshims

    node = tmp_path / "node"
    state = node / "state.json"
    nodestate.create(state, {**nodestate.default_state("spark-a"), "docker_store": "classic"})
    shims.install_shims(tmp_path / "bin", state_path=state)
    procshims.install_procshims(tmp_path / "bin")
    (node / "run").mkdir()
    env = {**os.environ, shims.STATE_ENV: str(state), "SPARKCTL_SIM_RUN_DIR": str(node / "run")}
    with nodestate.edit(state) as s:
        s["docker_store"] = store
    argv = ["docker", *rendered.DOCKER_LINES[0]]
    python = _run(tmp_path / "bin", env, *argv)  # the write dropped the views: Python answers, renders them
    assert (node / rendered.VIEWS_DIR / "docker.0.sh").is_file()
    assert _run(tmp_path / "bin", env, *argv) == python and python[2] == 0  # the view's answer
    assert ("io.containerd.snapshotter.v1" in python[0]) == (store == "containerd")
    view = node / rendered.VIEWS_DIR / "docker.0.sh"
    view.write_text("printf %s 'planted\n'\nexit 0\n")
    assert _run(tmp_path / "bin", env, *argv)[0] == "planted\n"  # the wrapper read it


def test_docker_image_inspect_is_a_view_of_the_image_store(tmp_path: Path) -> None:
    """sparkctl's image probes (``docker image inspect --format {{.Id}}`` and the content format) from
    the node's views: Python's answer, for every tag in the store; loading an image drops the views,
    so a newly loaded tag answers too; an absent one still gets docker's own refusal."""
    from sparkctl.model.imageid import CONTENT_FORMAT
    from sparkctl_sim import dockerimages, procshims

    assert CONTENT_FORMAT in rendered.IMAGE_FORMATS  # the sim renders what sparkctl asks
    node = tmp_path / "nodes" / "a"
    nodestate.create(node / "state.json", nodestate.default_state("spark-a"))
    (node / "run").mkdir()
    procshims.install_procshims(tmp_path / "bin")
    env = {**os.environ, "SPARKCTL_SIM_RUN_DIR": str(node / "run")}
    dockerimages.load_on_node(tmp_path, "a", "vllm-node:v1", layer_bytes=1 << 12)
    for fmt in rendered.IMAGE_FORMATS:
        argv = ["docker", "image", "inspect", "--format", fmt, "vllm-node:v1"]
        python = _run(tmp_path / "bin", env, *argv)  # no views yet: Python answers and renders them
        views = node / rendered.VIEWS_DIR / "docker-images.sh"
        assert python[2] == 0 and shlex.quote(f"5:{' '.join(argv[1:])}") in views.read_text()
        assert _run(tmp_path / "bin", env, *argv) == python
    dockerimages.load_on_node(tmp_path, "a", "vllm-node:v2", layer_bytes=1 << 12)
    assert not (node / rendered.VIEWS_DIR).exists()  # the store changed: its views are gone
    out = _run(tmp_path / "bin", env, "docker", "image", "inspect", "--format", "{{.Id}}", "vllm-node:v2")
    assert out[2] == 0 and out[0].startswith("sha256:")
    (node / rendered.VIEWS_DIR / "docker-images.sh").write_text(
        "case \"$#:$*\" in '5:image inspect --format {{.Id}} vllm-node:v2') printf %s 'planted\n'; exit 0 ;; esac\n")
    assert _run(tmp_path / "bin", env, "docker", "image", "inspect", "--format", "{{.Id}}", "vllm-node:v2")[0] \
        == "planted\n"  # the wrapper read it
    out = _run(tmp_path / "bin", env, "docker", "image", "inspect", "--format", "{{.Id}}", "nope:1")
    assert out[2] == 1 and "No such image: nope:1" in out[1]
