"""The SIMULATED tools' rendered views (sparkctl_sim/shims/rendered.py) answer exactly what the
Python shims answer, follow every state write, and fall back to Python for anything else."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
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


def test_an_engine_renders_the_views_of_the_state_it_writes_and_a_plain_write_drops_them(
        node: tuple[Path, dict[str, str]]) -> None:
    """An engine that registers or releases its memory renders the node's views itself (it is
    Python, the renderer costs it ~4 ms): the node's next uname is a view, no interpreter starts
    to render them (the first check after an `up` or a `down` paid that on every node). The
    nvidia-smi views follow the engine (its compute process), as the Python shim answers it."""
    from sparkctl_sim.engines.logs import EngineLog
    from sparkctl_sim.engines.runtime import register_memory, release_memory

    bin_dir, env = node
    state = bin_dir.parent / "node" / "state.json"
    views = state.parent / rendered.VIEWS_DIR
    mark = views / ".state"
    with nodestate.edit(state) as s:  # a writer without the renderer: the views are dropped
        s["faults"] = {"example": True}
    assert not nodestate.views_ready(state)
    log = EngineLog("vllm", 0, out=open(os.devnull, "w"), err=open(os.devnull, "w"))
    assert register_memory(str(state), os.getpid(), 90.0, log)
    assert nodestate.views_ready(state) and mark.read_text() == state.read_text()
    query = ("nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader")
    with_engine = _python(env, state, *query)
    assert str(os.getpid()) in with_engine[0] and _run(bin_dir, env, *query) == with_engine
    release_memory(str(state), os.getpid(), log)
    assert nodestate.views_ready(state) and mark.read_text() == state.read_text()
    assert _run(bin_dir, env, *query) == _python(env, state, *query) != with_engine


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


@pytest.mark.needs_root
def test_ps_in_a_format_without_a_pid_column_still_lists_only_its_own_nodes_processes(
    node: tuple[Path, dict[str, str]],
) -> None:
    """``ps -eo args`` (no PID column to filter by) listed every simulated node's processes: on
    spark-b it showed spark-a's engine, and a test took it for an engine left on spark-b. The
    wrapper puts a pid column first and cuts it off again: the caller's columns, its header only
    if it asked for one, this namespace's rows only; a default format with no PID column is an error."""
    bin_dir, env = node
    if os.geteuid() != 0:
        pytest.skip("unshare -n needs root")
    inside, outside_args = "sleep 3071", "sleep 3072"  # told apart by their arguments
    outside = subprocess.Popen(outside_args.split())
    try:
        (bin_dir.parent / "probe.sh").write_text(
            f"{inside} & s=$!\n"
            f"{bin_dir}/ps -eo args; echo \"rc=$?\"\n"
            f"echo @; {bin_dir}/ps -eo args=; echo @; {bin_dir}/ps axo comm,args\n"
            f"echo @; {bin_dir}/ps -e --no-headers; echo \"rc=$?\"; kill $s\n")
        state = bin_dir.parent / "node" / "state.json"
        r = subprocess.run(["unshare", "-n", "sh", str(bin_dir.parent / "probe.sh")], capture_output=True, text=True,
                           env={**env, shims.STATE_ENV: str(state)}, timeout=60)
    finally:
        outside.kill()
        outside.wait()
    args, bare, bsd, none = r.stdout.split("@\n")
    assert args.splitlines()[0] == "COMMAND" and "rc=0" in args, args
    assert inside in args and outside_args not in args, args
    assert not any(line.lstrip()[:1].isdigit() for line in args.splitlines()[1:]), args  # no pid column left
    assert "COMMAND" not in bare and inside in bare and outside_args not in bare, bare
    assert bsd.split()[:2] == ["COMMAND", "COMMAND"] and inside in bsd and outside_args not in bsd, bsd
    assert "rc=1" in none and "sleep" not in none and "no PID column" in r.stderr, (none, r.stderr)


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
    import time

    with nodestate.edit(state) as s:
        s["boot_time"] = time.time() - 3600  # booted an hour ago: -q's counters run
    for busy in (False, True):
        if busy:
            with nodestate.edit(state) as s:
                s["engine_mem_gib"] = {str(os.getpid()): 30.0}
        for _ in range(3):  # a pair that straddles a second boundary may differ: try again
            before = _python(env, state, "nvidia-smi", *args)
            a, b = _run(bin_dir, env, "nvidia-smi", *args), _python(env, state, "nvidia-smi", *args)
            if _sw_cap(a) == _sw_cap(b) == _sw_cap(before):
                break
        assert _sw_cap(a) == _sw_cap(b) and a[2] == 0
        if k == 2:  # the counter runs in microseconds of uptime: the view's lies between Python's two
            n = [int(m.group(1)) for m in (rendered._SW_CAP.search(x[0]) for x in (before, a, b)) if m]
            assert len(n) == 3 and n[0] <= n[1] <= n[2] and n[2] - n[0] < 10_000_000, n
        views = sorted(p.name for p in (state.parent / rendered.VIEWS_DIR).glob("nvidia-smi.*.sh"))
        assert len(views) >= rendered.SMI_WINDOW_S


def _sw_cap(out: tuple[str, str, int]) -> tuple[str, str, int]:
    return rendered._SW_CAP.sub("\nSW Power Capping: N us\n", out[0]), out[1], out[2]


def test_nvidia_smis_views_run_out_and_python_renders_the_next_ones(node: tuple[Path, dict[str, str]]) -> None:
    bin_dir, env = node
    views = bin_dir.parent / "node" / rendered.VIEWS_DIR
    for f in views.glob("nvidia-smi.*.sh"):
        f.unlink()  # as if the window ran out
    out = _run(bin_dir, env, "nvidia-smi", *rendered.SMI_LINES[0])
    assert out[2] == 0 and out[0].startswith("NVIDIA GB10, 12.1, ")
    assert len(list(views.glob("nvidia-smi.*.sh"))) == rendered.SMI_WINDOW_S  # one per second, an arm per line
    # a planted view for this second is what the wrapper prints: no Python computed it
    import time

    now = int(time.time())
    for sec in (now, now + 1, now + 2):
        (views / f"nvidia-smi.{sec}.sh").write_text("case \"$k\" in 0) printf %s 'planted\n'; exit 0 ;; esac\n")
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


# --------------------------------------------------------------------------- systemctl and journalctl in sh


@pytest.fixture
def units(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, dict[str, str]]:
    """``py``: the Python shim itself (the reference answers); ``sh``: the wrappers, with a Python
    that does not exist (an answer from them came from sh alone; a fallback exits 127)."""
    from sparkctl_sim import procshims

    py = tmp_path / "py"
    py.mkdir()
    root = str(Path(procshims.__file__).resolve().parents[1])
    for tool in ("systemctl", "journalctl", "docker"):
        (py / tool).write_text(f"#!/bin/sh\nPYTHONPATH={shlex.quote(root)} exec {shlex.quote(sys.executable)} -S "
                               f"-m sparkctl_sim.procshims {tool} \"$@\"\n")
        (py / tool).chmod(0o755)
    procshims.install_procshims(tmp_path / "sh", python="/nonexistent/python3")
    (tmp_path / "run" / "systemd").mkdir(parents=True)
    (tmp_path / "units" / "multi-user.target.wants").mkdir(parents=True)
    env = {**os.environ, "SPARKCTL_SIM_RUN_DIR": str(tmp_path / "run"), "SPARKCTL_SIM_UNIT_DIR": str(tmp_path / "units")}
    monkeypatch.setenv("SPARKCTL_SIM_UNIT_DIR", env["SPARKCTL_SIM_UNIT_DIR"])  # Units() here reads it too
    return py, tmp_path / "sh", env


def _start_ticks(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def _records() -> dict[str, dict[str, object]]:
    me = os.getpid()
    return {
        "none": {},
        "running": {"ActiveState": "active", "SubState": "running", "MainPID": me, "main_start": _start_ticks(me),
                    "NRestarts": 1, "Result": "success", "supervisor": {"pid": me, "start": _start_ticks(me)},
                    "starts": [1.5, 2.5]},
        # SIGKILLed supervisor and main process: systemd would have seen it die (Units.state)
        "gone": {"ActiveState": "active", "SubState": "running", "MainPID": 999_999_1, "main_start": 5,
                 "supervisor": {"pid": 999_999_2, "start": 6}},
        # the pid lives, but it is another process (its start time differs): dead too
        "reused": {"ActiveState": "activating", "SubState": "start", "MainPID": me, "main_start": 1,
                   "supervisor": {"pid": me, "start": 1}},
        "oneshot": {"ActiveState": "active", "SubState": "exited", "MainPID": 0, "main_start": None,
                    "supervisor": {"pid": 999_999_2, "start": None}},
        "limit": {"ActiveState": "failed", "SubState": "failed", "MainPID": None, "Result": "start-limit-hit",
                  "NRestarts": 4, "supervisor": None},
    }


QUERIES = [("show", "-p", "UnitFileState,ActiveState", "u"), ("show", "-p", "LoadState,UnitFileState,ActiveState,"
           "Result,NRestarts", "u.service"), ("show", "-p", "Id,Names,MainPID,ExecMainPID,SubState", "u"),
           ("is-active", "u"), ("is-active", "--quiet", "u"), ("is-active", "-q", "u.service")]


@pytest.mark.parametrize("record", list(_records()))
@pytest.mark.parametrize("unit_file", ["enabled", "disabled", "static", "loaded-only", "absent"])
def test_systemctls_read_only_lines_are_the_python_shims_answer_without_python(
        units: tuple[Path, Path, dict[str, str]], record: str, unit_file: str) -> None:
    from sparkctl_sim.systemdunits import Units

    py, sh, env = units
    root = Path(env["SPARKCTL_SIM_UNIT_DIR"])
    run = Path(env["SPARKCTL_SIM_RUN_DIR"]) / "systemd"
    if unit_file == "enabled":
        (root / "u.service").write_text("[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n")
        (root / "multi-user.target.wants" / "u.service").symlink_to(root / "u.service")
    elif unit_file in ("disabled", "static"):  # on disk and loaded by a daemon-reload, not enabled
        text = "[Service]\nExecStart=/bin/true\n" + (
            "\n[Install]\n# the engine's own\nWantedBy=multi-user.target\n" if unit_file == "disabled" else "")
        (root / "u.service").write_text(text)
        (run / "loaded").mkdir()
        (run / "loaded" / "u.service").write_text(text)
    elif unit_file == "loaded-only":
        (run / "loaded").mkdir()
        (run / "loaded" / "u.service").write_text("[Service]\nExecStart=/bin/true\n")
    rec = _records()[record]
    if rec:
        Units(run.parent).save_state("u.service", rec)
    for q in QUERIES:
        want = _run(py, env, "systemctl", *q)
        assert want[1] == "" and want[2] in (0, 3), (q, want)
        assert _run(sh, env, "systemctl", *q) == want, q
    if record == "gone":
        assert _run(sh, env, "systemctl", "show", "-p", "ActiveState,Result", "u")[0] == \
            "ActiveState=failed\nResult=signal\n"


def test_systemctl_lines_sh_cannot_answer_go_to_python(units: tuple[Path, Path, dict[str, str]]) -> None:
    py, sh, env = units
    root = Path(env["SPARKCTL_SIM_UNIT_DIR"])
    (root / "u.service").write_text("[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n")
    for q in [("show", "-p", "UnitFileState", "u"),  # not enabled, and no daemon-reload's copy to read [Install] from
              ("show", "u"), ("show", "-p", "ActiveState", "-p", "SubState", "u"), ("show", "-p", "Description", "u"),
              ("is-active", "u", "v"), ("status", "u"), ("start", "u"), ("show", "-p", "ActiveState", "--value", "u")]:
        assert _run(sh, env, "systemctl", *q)[2] == 127, q  # the wrapper's exec of the missing Python
    assert _run(py, env, "systemctl", "show", "-p", "UnitFileState", "u") == ("UnitFileState=disabled\n", "", 0)
    # a copy that differs from the disk (no daemon-reload since: Python warns), an [Install] line
    # sh does not read plainly: Python's
    loaded = Path(env["SPARKCTL_SIM_RUN_DIR"]) / "systemd" / "loaded" / "u.service"
    for text in ("[Service]\nExecStart=/bin/false\n", "[Service]\nExecStart=/bin/true\n[Install]\nWantedBy = a.target\n",
                 "[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=a.target \\\n  b.target\n"):
        (root / "u.service").write_text(text if "Install" in text else "[Service]\nExecStart=/bin/true\n")
        loaded.write_text(text)
        assert _run(sh, env, "systemctl", "show", "-p", "UnitFileState", "u")[2] == 127, text
    # a record whose value is no plain word (a string with a space) is Python's to read
    from sparkctl_sim.shimbase import _write_json_atomic

    _write_json_atomic(Path(env["SPARKCTL_SIM_RUN_DIR"]) / "systemd" / "u.service.json", {"ActiveState": "a b"})
    assert _run(sh, env, "systemctl", "is-active", "u")[2] == 127


def test_systemctl_enable_disable_stop_that_change_nothing_are_answered_in_sh_as_python_answers(
        units: tuple[Path, Path, dict[str, str]]) -> None:
    """``enable`` with every link there, ``disable`` with none, ``stop`` of a unit recorded inactive or failed:
    Python does nothing, sh answers the same (no output, exit 0) without Python; each one that would change
    something (a link to make or remove, a unit to stop, a copy that differs from the disk) is Python's."""
    from sparkctl_sim.systemdunits import Units

    py, sh, env = units
    root, run = Path(env["SPARKCTL_SIM_UNIT_DIR"]), Path(env["SPARKCTL_SIM_RUN_DIR"]) / "systemd"
    text = "[Service]\nExecStart=/bin/true\n\n[Install]\nWantedBy=multi-user.target other.target\n"
    (root / "u.service").write_text(text)
    (run / "loaded").mkdir()
    (run / "loaded" / "u.service").write_text(text)
    links = [root / "multi-user.target.wants" / "u.service", root / "other.target.wants" / "u.service"]

    def both(*q: str) -> tuple[str, str, int]:
        want = _run(py, env, "systemctl", *q)
        return want if _run(sh, env, "systemctl", *q) == want else ("differs", str(_run(sh, env, "systemctl", *q)), -1)

    # the links are missing: enable is Python's (it makes them), disable is a no-op
    assert _run(sh, env, "systemctl", "enable", "u")[2] == 127
    assert both("disable", "u") == ("", "", 0)
    assert _run(py, env, "systemctl", "enable", "u")[2] == 0 and all(ln.is_symlink() for ln in links)
    assert both("enable", "u") == ("", "", 0) and both("enable", "u.service") == ("", "", 0)
    assert _run(sh, env, "systemctl", "disable", "u")[2] == 127  # it would remove them
    links[1].unlink()
    assert _run(sh, env, "systemctl", "enable", "u")[2] == 127  # one to make again
    links[1].symlink_to(root / "u.service")
    # stop: no record is Python's; a record inactive or failed is a no-op; active is Python's
    assert _run(sh, env, "systemctl", "stop", "u")[2] == 127
    for state in ("inactive", "failed"):
        Units(run.parent).save_state("u.service", {"ActiveState": state, "SubState": "dead", "MainPID": 0})
        assert both("stop", "u") == ("", "", 0), state
    Units(run.parent).save_state("u.service", {"ActiveState": "active", "SubState": "running", "MainPID": 0})
    assert _run(sh, env, "systemctl", "stop", "u")[2] == 127
    # a daemon-reload's copy that differs from the disk, and any other form: Python's
    Units(run.parent).save_state("u.service", {"ActiveState": "inactive", "SubState": "dead", "MainPID": 0})
    (root / "u.service").write_text(text + "# changed\n")
    for q in [("enable", "u"), ("stop", "u"), ("enable", "--now", "u"), ("stop", "u", "v")]:
        assert _run(sh, env, "systemctl", *q)[2] == 127, q


def test_daemon_reload_in_sh_leaves_the_loaded_copies_python_leaves(tmp_path: Path,
                                                                    units: tuple[Path, Path, dict[str, str]]) -> None:
    """The stale copies gone, every plain ``*.service`` of the unit directory copied (no symlink, no
    other suffix); a dot file in either directory is Python's (its glob sees it, sh's does not)."""
    import shutil

    py, sh, env = units
    root, loaded = Path(env["SPARKCTL_SIM_UNIT_DIR"]), Path(env["SPARKCTL_SIM_RUN_DIR"]) / "systemd" / "loaded"
    (root / "a.service").write_text("[Service]\nExecStart=/bin/true\n")
    (root / "b c.service").write_text("[Service]\nExecStart=/bin/false\n")
    (root / "notes.txt").write_text("not a unit\n")
    (root / "link.service").symlink_to(root / "a.service")
    loaded.mkdir()

    def after(bin_dir: Path) -> tuple[tuple[str, str, int], dict[str, str]]:
        shutil.rmtree(loaded)
        loaded.mkdir()
        (loaded / "gone.service").write_text("[Service]\nExecStart=/bin/old\n")
        (loaded / "a.service").write_text("[Service]\nExecStart=/bin/old\n")
        out = _run(bin_dir, env, "systemctl", "daemon-reload")
        return out, {f.name: f.read_text() for f in sorted(loaded.iterdir())}

    want = after(py)
    assert want[0] == ("", "", 0) and sorted(want[1]) == ["a.service", "b c.service"], want
    assert after(sh) == want
    (root / ".hidden.service").write_text("[Service]\nExecStart=/bin/true\n")
    assert after(sh)[0][2] == 127  # Python's
    (root / ".hidden.service").unlink()
    (loaded / ".x").write_text("")
    assert _run(sh, env, "systemctl", "daemon-reload")[2] == 127
    assert _run(sh, env, "systemctl", "daemon-reload", "--no-block")[2] == 127


def test_docker_rm_of_a_container_no_store_holds_is_answered_in_sh_as_python_answers(
        units: tuple[Path, Path, dict[str, str]]) -> None:
    """``docker rm [-f] NAME`` with no container recorded: docker's "No such container", exit 1, from sh;
    any record in the store (it might be NAME) and any other form are Python's."""
    from sparkctl_sim.shimbase import Containers

    py, sh, env = units
    for q in [("rm", "-f", "sparkctl-engine"), ("rm", "--force", "x"), ("rm", "/sparkctl-engine")]:
        want = _run(py, env, "docker", *q)
        assert want == ("", f"Error response from daemon: No such container: {q[-1]}\n", 1), want
        assert _run(sh, env, "docker", *q) == want, q
    for q in [("rm", "-f"), ("rm", "-f", "a", "b"), ("rm", "-v", "a"), ("stop", "a")]:
        assert _run(sh, env, "docker", *q)[2] == 127, q
    Containers(Path(env["SPARKCTL_SIM_RUN_DIR"])).save({"id": "f" * 64, "name": "other", "status": "exited"})
    assert _run(sh, env, "docker", "rm", "-f", "sparkctl-engine")[2] == 127


def test_journalctl_in_sh_is_the_python_shims_answer(units: tuple[Path, Path, dict[str, str]]) -> None:
    py, sh, env = units
    journal = Path(env["SPARKCTL_SIM_RUN_DIR"]) / "systemd" / "earlyoom.service.journal.log"
    for argv in [("-b", "-u", "earlyoom", "-o", "cat", "--no-pager", "-q"), ("-u", "earlyoom")]:
        assert _run(sh, env, "journalctl", *argv) == ("", "", 0)  # no journal yet: nothing, like Python
    journal.write_text("2026-12-03T11:00:00+00:00 systemd[1]: earlyoom.service: Started Early OOM Daemon.\n"
                       "earlyoom v1.7\nmem avail: 100 of 128 GiB (78.12%)\n"
                       "sending SIGTERM to process 42 uid 0 \"vllm\": badness 900\n"
                       "x systemd[1]: no colon here\nsending SIGKILL to process 42")
    for argv in [("-b", "-u", "earlyoom", "-o", "cat", "--no-pager", "-q"), ("-u", "earlyoom"),
                 ("--unit=earlyoom.service", "-o", "short"), ("-q", "-b", "--unit", "earlyoom")]:
        want = _run(py, env, "journalctl", *argv)
        assert want[2] == 0 and _run(sh, env, "journalctl", *argv) == want, argv
    out = _run(sh, env, "journalctl", "-b", "-u", "earlyoom", "-o", "cat", "--no-pager", "-q")[0]
    assert out.startswith("Started Early OOM Daemon.\n") and out.count("sending SIG") == 2
    for argv in [("-u", "earlyoom", "-o", "json"), ("-f", "-u", "earlyoom"), ("-b",), ("-u",)]:
        assert _run(sh, env, "journalctl", *argv)[2] == 127, argv


@pytest.mark.needs_root
def test_carrier_views_in_a_node_namespace_are_the_python_shims_answer_absent_twins_included(tmp_path: Path) -> None:
    """In a namespace with its own sysfs and the management port (as every simulated node), a
    twin with carrier, one without and two with no netdev at all (a switched node cabled on one
    port) read in sh exactly as the Python shim reads them, and Python never starts."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    state = tmp_path / "node" / "state.json"
    nodestate.create(state, nodestate.default_state("spark-a"))
    rendered.ensure_views(state)
    stub = tmp_path / "no-python"
    stub.write_text("#!/bin/sh\necho 'python started' >&2\nexit 99\n")
    stub.chmod(0o755)
    shims.install_shims(tmp_path / "fast", python=str(stub), state_path=state)
    shims.install_shims(tmp_path / "bin", state_path=state)
    ns = f"sparkctl-test-views-{os.getpid()}"
    setup = ("ip link add enP7s7 type veth peer name m0 && ip link set enP7s7 up && ip link set m0 up && "
             "ip link add enp1s0f0np0 type veth peer name p0 && ip link set enp1s0f0np0 up && ip link set p0 up && "
             "ip link add enP2p1s0f0np0 type veth peer name p1 && ip link set enP2p1s0f0np0 up")  # p1 down: no carrier
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", ns, "sh", "-c", setup], check=True)
        env = {k: v for k, v in os.environ.items() if k not in (shims.STATE_ENV, "PYTHONPATH")}

        def both(*argv: str) -> tuple[tuple[str, str, int], tuple[str, str, int]]:
            out = []
            for d in ("fast", "bin"):
                r = subprocess.run(["ip", "netns", "exec", ns, str(tmp_path / d / argv[0]), *argv[1:]],
                                   capture_output=True, text=True, env=env, timeout=60)
                out.append((r.stdout, r.stderr, r.returncode))
            return out[0], out[1]

        sh, py = both("ibdev2netdev")
        assert sh == py and sh[0].split("\n")[:4] == [
            "rocep1s0f0 port 1 ==> enp1s0f0np0 (Up)", "rocep1s0f1 port 1 ==> enp1s0f1np1 (Down)",
            "roceP2p1s0f0 port 1 ==> enP2p1s0f0np0 (Down)", "roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Down)"]
        for nd in ("enp1s0f0np0", "enP2p1s0f0np0", "enp1s0f1np1", "enP2p1s0f1np1"):
            sh, py = both("ethtool", nd)
            assert sh == py, nd
            assert ("Link detected: yes" if nd == "enp1s0f0np0" else "Link detected: no") in sh[0]
        # without the management port the sysfs could be another namespace's: Python decides
        subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "delete", "enP7s7"], check=True)
        sh, py = both("ethtool", "enp1s0f1np1")
        assert sh[2] == 99 and "python started" in sh[1] and py[2] == 0
    finally:
        subprocess.run(["ip", "netns", "delete", ns], check=False)
