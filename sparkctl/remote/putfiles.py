"""Atomic writes of a node's files in one shell session: the script, its argv, and its reading. Stdlib only.

The operator's transport writes with it (``sparkctl.transport.base``: ``put``, ``put_all``),
and so does the plan runner on the head of a supervised switch (``planrun.py``, which
reaches its peers over its own ssh): this file is pushed beside it, as
``endpoint_probe.py`` is.
"""

from __future__ import annotations

from collections.abc import Sequence

# The script: every value arrives as a positional parameter, so nothing the caller passes is ever
# parsed as shell. Each file is three parameters (path, mode, size) and its bytes, in order, on stdin:
# one session writes a node's files. `head -c SIZE` reads exactly that many bytes of a pipe and no
# more (coreutils head.c, head_bytes: each read asks for at most what is left), so each file takes its
# own bytes; one that arrives short (the connection cut mid-stream, cat would have written what came)
# is refused and the file left as it was. The temporary file lives in the destination directory, made
# by mktemp (0600 before a byte is written), so the final mv is a rename(2) on one filesystem; a node
# stops at its first failed file and says which.
PUT_SCRIPT = r"""set -eu
tmp= dst=
trap 'rc=$?; [ -z "$tmp" ] || rm -f -- "$tmp"; [ "$rc" = 0 ] || echo "sparkctl-put: stopped at $dst" >&2' EXIT
while [ "$#" -ge 3 ]; do
dst=$1 mode=$2 size=$3
shift 3
case $dst in */*) dir=${dst%/*} ;; *) dir=. ;; esac
[ -n "$dir" ] || dir=/
mkdir -p -- "$dir"
tmp=$(mktemp "$dir/.sparkctl-put.XXXXXXXX")
head -c "$size" > "$tmp"
got=$(wc -c < "$tmp")
[ "$got" -eq "$size" ] || { echo "sparkctl-put: $got of $size bytes arrived" >&2; exit 1; }
chmod "$mode" "$tmp"
mv -f -- "$tmp" "$dst"
tmp=
done
"""


def put_command(files: Sequence[tuple[str, int, int]]) -> list[str]:
    """The argv that atomically writes each ``(remote_path, mode, size)``, in order, from stdin's bytes."""
    argv = ["sh", "-c", PUT_SCRIPT, "sparkctl-put"]
    for remote_path, mode, size in files:
        if not remote_path or remote_path.endswith("/"):
            raise ValueError(f"put needs a file path, got {remote_path!r}")
        if "\0" in remote_path or "\n" in remote_path:
            raise ValueError(f"put refuses a path with NUL or newline: {remote_path!r}")
        argv += [remote_path, f"{mode & 0o7777:04o}", str(size)]
    return argv


def put_files(argv: Sequence[str], data: bytes) -> list[tuple[str, int, bytes]]:
    """What a :func:`put_command` writes: ``(remote_path, mode, bytes)`` each, from its argv and stdin."""
    out, at = [], 0
    args = list(argv[4:])
    for i in range(0, len(args) - 2, 3):
        size = int(args[i + 2])
        out.append((args[i], int(args[i + 1], 8), data[at:at + size]))
        at += size
    return out


__all__ = ["PUT_SCRIPT", "put_command", "put_files"]
