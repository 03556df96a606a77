"""systemd's file formats for the simulated `systemctl`: command lines, environment files, unit files, the unit store.

SIMULATION ONLY (sparkctl_sim.procshims documents the deliberate differences).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkctl_sim.shimbase import (
    ENV_NAME_RE,
    EXEC_DIRECTORY_ROOTS,
    START_LIMIT_BURST,
    START_LIMIT_INTERVAL_S,
    UNIT_DIR_ENV,
    ShimError,
    _alive,
    _locked,
    _read_json,
    _write_json_atomic,
    parse_signal,
)

# ===========================================================================
# systemd: unit files, environment files, command lines

_C_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
              "\\": "\\", '"': '"', "'": "'", "s": " "}


def split_systemd_words(text: str) -> list[str]:
    """Split a systemd setting into words (extract_first_word with unquoting and C escapes).

    Double and single quotes group words and are removed; backslash escapes
    (``\\n``, ``\\t``, ``\\"``, ``\\\\``, ``\\xNN``, octal ``\\NNN``) are decoded
    both inside and outside quotes. ``$`` is left alone for the later
    variable expansion step.
    """
    words: list[str] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in " \t\n":
            i += 1
        if i >= n:
            return words
        buf: list[str] = []
        quote: str | None = None
        while i < n:
            c = text[i]
            if quote is None and c in " \t\n":
                break
            if c == "\\":
                if i + 1 >= n:
                    raise ValueError("trailing backslash")
                i, decoded = _decode_escape(text, i + 1)
                buf.append(decoded)
                continue
            if quote is None and c in "\"'":
                quote = c
            elif quote is not None and c == quote:
                quote = None
            else:
                buf.append(c)
            i += 1
        if quote is not None:
            raise ValueError(f"unbalanced quotes in: {text}")
        words.append("".join(buf))


def _decode_escape(text: str, i: int) -> tuple[int, str]:
    c = text[i]
    if c in _C_ESCAPES:
        return i + 1, _C_ESCAPES[c]
    if c == "x" and re.fullmatch(r"[0-9a-fA-F]{2}", text[i + 1:i + 3]):
        return i + 3, chr(int(text[i + 1:i + 3], 16))
    if re.fullmatch(r"[0-7]{3}", text[i:i + 3]):
        return i + 3, chr(int(text[i:i + 3], 8))
    if c == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[i + 1:i + 5]):
        return i + 5, chr(int(text[i + 1:i + 5], 16))
    raise ValueError(f"invalid escape \\{c}")


def expand_systemd_argv(words: Sequence[str], env: dict[str, str]) -> list[str]:
    """systemd's variable substitution on an already-unquoted command line.

    ``${VAR}`` (anywhere in a word) is replaced by the exact value; a word that
    is exactly ``$VAR`` is replaced by the value split at whitespace (zero or
    more words); ``$$`` is a literal ``$``; a ``$NAME`` inside a longer word
    is left as it is. Unset variables expand to nothing.
    """
    out: list[str] = []
    for word in words:
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if m:
            out.extend(env.get(m.group(1), "").split())
            continue
        out.append(_expand_curly(word, env))
    return out


def _expand_curly(word: str, env: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        return "$" if m.group(0) == "$$" else env.get(m.group(1), "")

    return re.sub(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}", sub, word)


def parse_systemd_env_file(text: str) -> list[tuple[str, str]]:
    """Parse an ``EnvironmentFile=`` the way systemd does (no variable expansion).

    ``KEY=VALUE`` per line, ``#``/``;`` comments, whitespace around unquoted
    values trimmed, single quotes literal, double quotes with ``\\"``,
    ``\\\\``, ``\\$`` and ``\\``` escapes, backslash-newline continues a line.
    Lines without ``=`` and invalid names are ignored (systemd logs them).
    """
    out: list[tuple[str, str]] = []
    state = "pre_key"
    key: list[str] = []
    val: list[str] = []
    last_ws = -1  # index in val after which only unquoted trailing whitespace follows

    def push() -> None:
        k = "".join(key).rstrip()
        v = "".join(val)
        if last_ws >= 0:
            v = v[:last_ws]
        if ENV_NAME_RE.match(k):
            out.append((k, v))

    for c in text + "\n":
        if state == "pre_key":
            if c in "#;":
                state = "comment"
            elif not c.isspace():
                key, state = [c], "key"
        elif state == "key":
            if c == "\n":
                state = "pre_key"  # a name without '=' is ignored
            elif c == "=":
                val, last_ws, state = [], -1, "pre_value"
            else:
                key.append(c)
        elif state == "pre_value":
            if c == "\n":
                push()
                state = "pre_key"
            elif c == "'":
                state = "single"
            elif c == '"':
                state = "double"
            elif c == "\\":
                state = "value_escape"
            elif not c.isspace():
                val.append(c)
                state = "value"
        elif state == "value":
            if c == "\n":
                push()
                state = "pre_key"
            elif c == "\\":
                last_ws = -1
                state = "value_escape"
            else:
                if c.isspace():
                    if last_ws < 0:
                        last_ws = len(val)
                else:
                    last_ws = -1
                val.append(c)
        elif state == "value_escape":
            state = "value"
            if c != "\n":
                val.append(c)
        elif state == "single":
            if c == "'":
                state = "pre_value"
            else:
                val.append(c)
        elif state == "double":
            if c == '"':
                state = "pre_value"
            elif c == "\\":
                state = "double_escape"
            else:
                val.append(c)
        elif state == "double_escape":
            state = "double"
            if c in '"\\`$':
                val.append(c)
            elif c != "\n":
                val.extend(("\\", c))
        elif state == "comment":
            if c == "\\":
                state = "comment_escape"
            elif c == "\n":
                state = "pre_key"
        elif state == "comment_escape":
            state = "comment"
    return out


_TIME_UNITS = {"us": 1e-6, "usec": 1e-6, "ms": 1e-3, "msec": 1e-3, "s": 1.0, "sec": 1.0,
               "second": 1.0, "seconds": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0,
               "minutes": 60.0, "h": 3600.0, "hr": 3600.0, "hour": 3600.0, "hours": 3600.0}


def parse_timespan_s(text: str) -> float:
    """systemd time span (``90``, ``5s``, ``1min 30s``, ``500ms``, ``infinity``) in seconds."""
    text = text.strip()
    if text == "infinity":
        return float("inf")
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    total = 0.0
    pos = 0
    for m in re.finditer(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)", text):
        if m.start() != pos or m.group(2) not in _TIME_UNITS:
            raise ValueError(f"invalid time span: {text}")
        total += float(m.group(1)) * _TIME_UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or pos == 0:
        raise ValueError(f"invalid time span: {text}")
    return total


@dataclass(frozen=True)
class ExecCommand:
    """One ``Exec*=`` line: prefix flags plus the unquoted words (not yet expanded)."""

    words: tuple[str, ...]
    ignore_failure: bool = False  # '-'
    argv0_override: bool = False  # '@': second word is argv[0]
    no_expand: bool = False  # ':'
    line: str = ""


# Settings systemd knows that the sim accepts and does not act on.
_IGNORED_KEYS = {
    "Unit": {"After", "Before", "Wants", "Requires", "BindsTo", "PartOf", "Conflicts",
             "Documentation", "ConditionPathExists",
             "AssertPathExists", "DefaultDependencies"},
    "Service": {"Group", "KillMode", "TimeoutStartSec", "TimeoutSec", "SuccessExitStatus",
                "LimitNOFILE", "LimitCORE", "LimitSTACK", "Nice", "SyslogIdentifier",
                "PIDFile", "NotifyAccess", "OOMScoreAdjust", "SendSIGKILL", "UMask",
                "StandardInput", "Delegate", "CPUAffinity",
                # Debian's earlyoom.service (sparkctl_sim.debpkg): sandboxing and resource
                # limits, recorded nowhere: the simulated node has no cgroups or credentials
                "DynamicUser", "AmbientCapabilities", "ProtectSystem", "ProtectHome", "TasksMax",
                "MemoryMax"},
    "Install": {"Alias", "Also", "DefaultInstance"},
}
_MULTI_EXEC = ("ExecStartPre", "ExecStart", "ExecStartPost", "ExecStop", "ExecStopPost")


@dataclass
class Unit:
    """A parsed service unit; ``warnings`` are what systemd would log and ignore."""

    name: str
    path: str
    text: str
    description: str = ""
    type: str = "simple"
    exec: dict[str, list[ExecCommand]] = field(default_factory=dict)
    environment: list[tuple[str, str]] = field(default_factory=list)
    environment_files: list[tuple[str, bool]] = field(default_factory=list)  # (path, optional)
    working_directory: str | None = None
    working_directory_optional: bool = False
    restart: str = "no"
    restart_sec_s: float = 0.1
    # Start rate limiting, [Unit] StartLimitIntervalSec= / StartLimitBurst=; absent, the
    # manager's DefaultStartLimitIntervalSec=10s and DefaultStartLimitBurst=5
    # (systemd-system.conf(5)). 0 for either disables the limit (systemd.unit(5)).
    start_limit_interval_s: float = START_LIMIT_INTERVAL_S
    start_limit_burst: int = START_LIMIT_BURST
    kill_signal: int = int(signal.SIGTERM)
    timeout_stop_s: float = 90.0
    user: str | None = None
    standard_output: str = "journal"
    standard_error: str = "inherit"
    remain_after_exit: bool = False
    limit_memlock: str | None = None
    exec_directories: list[tuple[str, str]] = field(default_factory=list)  # (setting, name)
    wanted_by: list[str] = field(default_factory=list)
    required_by: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _specifiers(value: str, unit_name: str) -> str:
    prefix = unit_name.rsplit(".", 1)[0]
    table = {"%": "%", "n": unit_name, "N": prefix, "p": prefix, "i": "", "t": "/run"}

    def sub(m: re.Match[str]) -> str:
        if m.group(1) not in table:
            raise ValueError(f"unsupported specifier %{m.group(1)}")
        return table[m.group(1)]

    return re.sub(r"%(.)", sub, value)


def _parse_exec(value: str) -> ExecCommand:
    flags = ""
    while value and value[0] in "-@:+!":
        flags += value[0]
        value = value[1:]
    words = split_systemd_words(value)
    if ";" in words:
        raise ValueError("';'-separated command lists are not supported by the sim")
    if not words:
        raise ValueError("empty command")
    return ExecCommand(tuple(words), ignore_failure="-" in flags, argv0_override="@" in flags,
                       no_expand=":" in flags, line=value)


def parse_unit(name: str, path: str, text: str) -> Unit:
    """Parse a service unit file with systemd's syntax rules (see module docstring)."""
    unit = Unit(name=name, path=path, text=text)
    section = ""
    logical: list[tuple[int, str]] = []
    pending = ""
    start_line = 0
    for lineno, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if pending and stripped[:1] in ("#", ";"):
            continue  # comment lines inside a continuation are skipped
        if not pending:
            start_line = lineno
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append((start_line, pending + stripped))
        pending = ""
    if pending:
        logical.append((start_line, pending))
    for lineno, line in logical:
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, eq, value = line.partition("=")
        key, value = key.strip(), value.strip()
        where = f"{path}:{lineno}"
        if not eq:
            unit.warnings.append(f"{where}: Missing '=', ignoring line.")
            continue
        try:
            _apply_setting(unit, section, key, value)
        except ValueError as exc:
            unit.warnings.append(f"{where}: Invalid value for {key}=: {exc}; ignoring.")
        except KeyError:
            unit.warnings.append(f"{where}: Unknown key name '{key}' in section '{section}', "
                                 "ignoring.")
    return unit


def _apply_setting(unit: Unit, section: str, key: str, value: str) -> None:  # noqa: C901
    if key in _IGNORED_KEYS.get(section, set()):
        return
    if section == "Unit" and key == "Description":
        unit.description = value
    elif section == "Service" and key in _MULTI_EXEC:
        if value == "":
            unit.exec[key] = []  # an empty assignment resets the list
        else:
            unit.exec.setdefault(key, []).append(_parse_exec(_specifiers(value, unit.name)))
    elif section == "Service" and key == "Type":
        if value not in ("simple", "exec", "oneshot", "forking", "notify", "dbus", "idle"):
            raise ValueError(value)
        unit.type = value
    elif section == "Service" and key == "Environment":
        if value == "":
            unit.environment = []
        for word in split_systemd_words(_specifiers(value, unit.name)):
            k, eq, v = word.partition("=")
            if not eq or not ENV_NAME_RE.match(k):
                raise ValueError(f"invalid environment assignment {word!r}")
            unit.environment.append((k, v))
    elif section == "Service" and key == "EnvironmentFile":
        if value == "":
            unit.environment_files = []
            return
        optional = value.startswith("-")
        unit.environment_files.append((_specifiers(value.lstrip("-"), unit.name), optional))
    elif section == "Service" and key == "WorkingDirectory":
        unit.working_directory_optional = value.startswith("-")
        unit.working_directory = _specifiers(value.lstrip("-"), unit.name) or None
    elif section == "Unit" and key in ("StartLimitIntervalSec", "StartLimitInterval"):
        # "StartLimitInterval=" is the pre-v230 spelling, still accepted in [Unit] (systemd.unit(5)).
        unit.start_limit_interval_s = START_LIMIT_INTERVAL_S if value == "" else parse_timespan_s(value)
    elif section == "Unit" and key == "StartLimitBurst":
        if value == "":
            unit.start_limit_burst = START_LIMIT_BURST
        elif not value.isdigit():
            raise ValueError(value)
        else:
            unit.start_limit_burst = int(value)
    elif section == "Service" and key == "Restart":
        if value not in ("no", "on-success", "on-failure", "on-abnormal", "on-watchdog",
                         "on-abort", "always"):
            raise ValueError(value)
        unit.restart = value
    elif section == "Service" and key == "RestartSec":
        unit.restart_sec_s = parse_timespan_s(value)
    elif section == "Service" and key == "KillSignal":
        unit.kill_signal = parse_signal(value)
    elif section == "Service" and key in ("TimeoutStopSec",):
        unit.timeout_stop_s = parse_timespan_s(value)
    elif section == "Service" and key == "User":
        unit.user = value  # recorded, ignored: the sim runs everything as the caller
    elif section == "Service" and key in ("StandardOutput", "StandardError"):
        kind = value.partition(":")[0]
        if kind not in ("inherit", "null", "journal", "kmsg", "tty", "journal+console",
                        "kmsg+console", "append", "file", "truncate", "syslog"):
            raise ValueError(value)
        value = _specifiers(value, unit.name)
        if key == "StandardOutput":
            unit.standard_output = value
        else:
            unit.standard_error = value
    elif section == "Service" and key == "RemainAfterExit":
        unit.remain_after_exit = value.lower() in ("yes", "true", "1", "on")
    elif section == "Service" and key == "LimitMEMLOCK":
        unit.limit_memlock = value
    elif section == "Service" and key in EXEC_DIRECTORY_ROOTS:
        if value == "":
            unit.exec_directories = [d for d in unit.exec_directories if d[0] != key]
            return
        for name in split_systemd_words(_specifiers(value, unit.name)):
            name = name.partition(":")[0]  # NAME:SYMLINK; the symlink part is not simulated
            # systemd refuses absolute names and ".." (src/core/load-fragment.c,
            # config_parse_exec_directories: "... is not valid, ignoring").
            parts = name.split("/")
            if name.startswith("/") or any(x in ("", ".", "..") for x in parts):
                raise ValueError(f"{key}= path is not valid: {name}")
            unit.exec_directories.append((key, name))
    elif section == "Install" and key == "WantedBy":
        unit.wanted_by.extend(value.split())
    elif section == "Install" and key == "RequiredBy":
        unit.required_by.extend(value.split())
    else:
        raise KeyError(key)


# ===========================================================================
# systemctl: state and supervision


def _unit_name(name: str) -> str:
    return name if "." in name else f"{name}.service"


class Units:
    """Loaded units and their runtime records for one simulated node."""

    def __init__(self, run_dir: Path) -> None:
        unit_dir = os.environ.get(UNIT_DIR_ENV)
        if not unit_dir:
            raise ShimError(f"sparkctl sim: {UNIT_DIR_ENV} is not set", 1)
        self.unit_dir = Path(unit_dir)
        self.root = run_dir / "systemd"
        self.loaded = self.root / "loaded"
        self.loaded.mkdir(parents=True, exist_ok=True)

    def lock(self, name: str) -> contextlib.AbstractContextManager[None]:
        return _locked(self.root / f"{name}.lock")

    def state_path(self, name: str) -> Path:
        return self.root / f"{name}.json"

    def journal(self, name: str) -> Path:
        return self.root / f"{name}.journal.log"

    def state(self, name: str) -> dict[str, Any]:
        rec = _read_json(self.state_path(name)) or {}
        rec.setdefault("ActiveState", "inactive")
        rec.setdefault("SubState", "dead")
        rec.setdefault("MainPID", 0)
        rec.setdefault("Result", "success")
        rec.setdefault("NRestarts", 0)
        # A supervisor that vanished (SIGKILLed, node power-cycled) leaves a unit
        # that systemd would have seen die: report what the processes say.
        if rec["ActiveState"] in ("active", "activating", "deactivating") and rec.get("supervisor"):
            sup = rec["supervisor"]
            if not _alive(sup.get("pid"), sup.get("start")) and not _alive(
                    rec["MainPID"], rec.get("main_start")):
                if not (rec["ActiveState"] == "active" and rec.get("SubState") == "exited"):
                    rec.update(ActiveState="failed", SubState="failed", MainPID=0, Result="signal")
        return rec

    def save_state(self, name: str, rec: dict[str, Any]) -> None:
        _write_json_atomic(self.state_path(name), rec)

    def update(self, name: str, **changes: Any) -> dict[str, Any]:
        with self.lock(name):
            rec = _read_json(self.state_path(name)) or {}
            rec.update(changes)
            self.save_state(name, rec)
            return rec

    def disk_path(self, name: str) -> Path:
        return self.unit_dir / name

    def daemon_reload(self) -> None:
        for old in self.loaded.glob("*"):
            old.unlink()
        if self.unit_dir.is_dir():
            for path in self.unit_dir.iterdir():
                if path.is_file() and not path.is_symlink() and path.suffix == ".service":
                    shutil.copyfile(path, self.loaded / path.name)

    def load(self, name: str) -> Unit | None:
        """The unit as systemd has it loaded: the last daemon-reload's copy.

        A unit never loaded is read from disk on demand (as systemd does); a
        loaded unit whose file changed since keeps its old definition and the
        caller is warned, exactly like ``systemctl`` does.
        """
        snap = self.loaded / name
        disk = self.disk_path(name)
        if not snap.exists():
            if not disk.is_file():
                return None
            shutil.copyfile(disk, snap)
        text = snap.read_text(encoding="utf-8")
        try:
            if disk.read_text(encoding="utf-8") != text:
                print(f"Warning: The unit file, source configuration file or drop-ins of {name} "
                      "changed on disk. Run 'systemctl daemon-reload' to reload units.",
                      file=sys.stderr)
        except OSError:
            pass
        return parse_unit(name, str(disk), text)
