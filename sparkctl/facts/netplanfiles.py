"""The node's netplan files and the interfaces each one configures.

Why: netplan reads every ``/etc/netplan/*.yaml`` and merges them, concatenating
the address lists of a device defined in several files (netplan
doc/netplan-generate.md, "the lists are concatenated"). A file left by NVIDIA's
"Connect two Sparks" playbook (``/etc/netplan/40-cx7.yaml``: ``link-local:
[ipv4]``, or static 192.168.100.x/24 and 192.168.101.x/24 on the CX-7 ports)
gives a fabric port a second IPv4 address, and with it a second RoCE v2 GID,
next to sparkctl's. ``fabric apply`` reads this fact to take such a file aside
(or refuse), and the fabric law names the file that causes an extra address.

The command prints, for each ``/etc/netplan/*.yaml`` in name order (netplan(5):
files are read in lexical order of their names), ``file NAME``, the file's
bytes in base64 (exact bytes: the SHA-256 is taken from them; no line of the
YAML can look like a batch marker), and ``end``; a file the session cannot read
(netplan files are 0600 root) is read with ``sudo -n`` on a node that allows it,
and otherwise reported as ``unreadable NAME``. The parser reads what each file configures. It must not run
anything.
"""

from __future__ import annotations

import base64
import binascii
import hashlib

from sparkctl.facts.registry import NOT_FOUND, Fact, ProbeParseError, ScriptContext, q
from sparkctl.model.netplanfile import NetplanFile
from sparkctl.model.paths import NETPLAN_DIR, under

# netplan's device sections (netplan doc/netplan-yaml.md, "Device types")
DEVICE_TYPES = ("ethernets", "modems", "wifis", "bridges", "bonds", "tunnels", "vlans", "vrfs", "nm-devices",
                "dummy-devices", "virtual-ethernets")


def _names(section: str, ident: str, conf: object) -> list[str]:
    """What a definition names: with ``match:`` the id is only a label (netplan doc/netplan-yaml.md,
    "match": "the ID is not the interface name"), so its ``match: name:`` (a glob) or ``set-name:``;
    a match by driver or MAC alone is kept as ``match:driver=...`` / ``match:macaddress=...``."""
    if not isinstance(conf, dict):
        return [ident]
    match = conf.get("match")
    out = [] if isinstance(match, dict) else [ident]
    if isinstance(match, dict):
        if isinstance(match.get("name"), str):
            out.append(match["name"])
        elif not isinstance(conf.get("set-name"), str):
            out += [f"match:{k}={match[k]}" for k in ("driver", "macaddress") if isinstance(match.get(k), str)]
    if isinstance(conf.get("set-name"), str):
        out.append(conf["set-name"])
    if section in ("bonds", "bridges", "vrfs") and isinstance(conf.get("interfaces"), list):
        out += [str(i) for i in conf["interfaces"]]
    if section == "vlans" and isinstance(conf.get("link"), str):
        out.append(conf["link"])
    return out


def describe_file(name: str, data: bytes) -> NetplanFile:
    """What one netplan file configures (pure: the YAML, read safely)."""
    import yaml  # here: the node's exporter imports this module without PyYAML (sparkctl.node.bundle)

    sha = hashlib.sha256(data).hexdigest()
    try:
        doc = yaml.safe_load(data.decode("utf-8", errors="replace"))
    except yaml.YAMLError as e:
        return NetplanFile(name, sha, error=f"not YAML: {str(e).splitlines()[0][:80]}")
    net = doc.get("network") if isinstance(doc, dict) else None
    if doc is None or net is None:
        return NetplanFile(name, sha)  # an empty file or no network: configures nothing
    if not isinstance(net, dict):
        return NetplanFile(name, sha, error="`network:` is not a mapping")
    seen: list[str] = []
    for section in DEVICE_TYPES:
        defs = net.get(section)
        if isinstance(defs, dict):
            for ident, conf in defs.items():
                for n in _names(section, str(ident), conf):
                    if n not in seen:
                        seen.append(n)
    renderer = net.get("renderer")
    return NetplanFile(name, sha, tuple(seen), renderer if isinstance(renderer, str) else "")


def parse_netplan_files(text: str) -> tuple[NetplanFile, ...]:
    """``file NAME`` / base64 lines / ``end`` blocks, and ``unreadable NAME`` lines."""
    out: list[NetplanFile] = []
    current: str | None = None
    chunks: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if current is None:
            kind, _, name = line.partition(" ")
            if kind == "file" and name:
                current, chunks = name, []
            elif kind == "unreadable" and name:
                out.append(NetplanFile(name, error="unreadable (netplan files are root's, mode 0600)"))
            else:
                raise ProbeParseError("netplan files", f"unexpected line {line[:50]!r}", "base64")
        elif line == "end":
            try:
                data = base64.b64decode("".join(chunks), validate=True)
            except (binascii.Error, ValueError):
                raise ProbeParseError("netplan files", f"{current}: not base64", "base64") from None
            out.append(describe_file(current, data))
            current = None
        else:
            chunks.append(line)
    if current is not None:
        raise ProbeParseError("netplan files", f"{current}: cut off before its end line", "base64")
    return tuple(out)


def command_for(prefix: str, sudo: bool = False) -> str:
    """The shell body that prints the fact for a node with this filesystem prefix; with
    ``sudo`` (the node allows ``sudo -n``) a file the session cannot read is read as root."""
    d = q(under(prefix, NETPLAN_DIR))
    as_root = ('elif have sudo && d=$(sudo -n base64 "$f" 2>/dev/null); then echo "file $n"; echo "$d"; echo end; '
               if sudo else "")
    return (f"have base64 || exit 127; for f in {d}/*.yaml; do [ -f \"$f\" ] || continue; "
            'n=${f##*/}; if [ -r "$f" ]; then echo "file $n"; base64 < "$f"; echo end; '
            + as_root + 'else echo "unreadable $n"; fi; done')


def _command(ctx: ScriptContext, _item: str) -> str:
    return command_for(ctx.node.prefix, ctx.node.sudo)


NETPLAN_FILES = Fact("netplan.files", "netplan files (/etc/netplan/*.yaml)", _command, parse_netplan_files,
                     exit_codes=(NOT_FOUND,), core=False)
