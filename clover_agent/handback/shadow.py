"""The shadow repository: a bare git repository on the host holding the workspace as it started
and as the agent left it, built from bytes, diffed with git's plumbing.

Nothing of the sandbox's git is used: commits are written with ``git fast-import`` (bytes in,
exact paths and modes, no filters, no hooks), the patch comes from ``git diff-tree`` in a clean
environment (:mod:`clover_agent.handback.hostgit`; no external diff, no text conversion, full blob
ids, binary-safe), and the changed files from its machine-readable output (``--raw -z`` and
``--numstat -z``), never from the patch's headers. ``info/attributes`` unsets every attribute
that would transform content (``text``, ``eol``, ``filter``, ``ident``,
``working-tree-encoding``): it has the highest precedence, and a bare repository reads no
``.gitattributes`` from the trees it holds anyway.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from clover_agent.handback.hostgit import (
    GIT_TIMEOUT_S,
    HostGitError,
    config_environment,
    environment,
    git,
)

#: Git's file modes.
REGULAR, EXECUTABLE, SYMLINK = 0o100644, 0o100755, 0o120000
_ATTRIBUTES = b"* -text -eol -filter -ident -working-tree-encoding\n"
_COMMITTER = b"committer clover-agent <clover-agent@localhost> 0 +0000\n"


def quote_path(path: str) -> bytes:
    """``path`` as a C-style quoted string, the form git's ``fast-import`` reads for any bytes."""
    out = bytearray(b'"')
    for byte in path.encode("utf-8", "surrogateescape"):
        if byte in (0x22, 0x5C):
            out += b"\\" + bytes([byte])
        elif 0x20 <= byte < 0x7F:
            out.append(byte)
        else:
            out += b"\\%03o" % byte
    return bytes(out + b'"')


@dataclass(frozen=True)
class Change:
    """One path the patch touches, from ``git diff-tree --raw``: the modes are git's (0: absent)."""

    path: str
    status: str  # "added" | "modified" | "deleted" | "type changed"
    old_mode: int
    new_mode: int
    old_oid: str
    new_oid: str
    binary: bool = False
    target: str | None = None  # what a new symlink points to

    @property
    def notes(self) -> list[str]:
        """What needs a second look beyond a text edit (shown, and confirmed before applying; a new
        executable file needs a yes by its path's rules: :mod:`clover_agent.handback.paths`)."""
        notes = []
        if self.new_mode == SYMLINK:
            notes.append(f"a symlink to {self.target}")
        elif self.binary and self.new_mode:
            notes.append("binary")
        if self.old_mode in (REGULAR, EXECUTABLE) and self.new_mode in (REGULAR, EXECUTABLE):
            if self.old_mode != self.new_mode:
                notes.append("executable bit " + ("set" if self.new_mode == EXECUTABLE else "cleared"))
        elif self.status == "type changed":
            notes.append("replaces a " + ("symlink" if self.old_mode == SYMLINK else "file"))
        return notes


_STATUS = {"A": "added", "M": "modified", "D": "deleted", "T": "type changed"}


class ShadowRepo:
    """A bare repository at ``path`` (made when missing)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if not (path / "HEAD").exists():
            path.mkdir(parents=True, exist_ok=True)
            git(path, "init", "-q", "--bare", "--template=")
            (path / "info").mkdir(exist_ok=True)
            (path / "info" / "attributes").write_bytes(_ATTRIBUTES)

    def writer(self, ref: str, parent: str | None = None) -> CommitWriter:
        """A commit to write onto ``ref`` (on top of the commit ``parent``)."""
        return CommitWriter(self, ref, parent)

    def resolve(self, ref: str) -> str:
        return git(self.path, "rev-parse", "--verify", "-q", f"{ref}^{{commit}}").stdout.decode().strip()

    def patch(self, old: str, new: str) -> bytes:
        """The binary-safe patch from ``old`` to ``new`` (``git apply`` reads it as it is)."""
        return git(
            self.path,
            "diff-tree", "-r", "-p", "--binary", "--full-index", "--no-renames", "--no-color",
            "--no-ext-diff", "--no-textconv", "--src-prefix=a/", "--dst-prefix=b/", old, new,
        ).stdout  # fmt: skip

    def changes(self, old: str, new: str) -> list[Change]:
        """Every path that differs, with its modes, blob ids and whether git sees it as binary."""
        raw = git(self.path, "diff-tree", "-r", "-z", "--no-renames", "--raw", old, new).stdout
        fields = raw.split(b"\0")
        found: list[tuple[str, str, int, int, str, str]] = []
        i = 0
        while i + 1 < len(fields) and fields[i].startswith(b":"):
            old_mode, new_mode, old_oid, new_oid, status = fields[i][1:].decode().split(" ")
            path = fields[i + 1].decode("utf-8", "surrogateescape")
            found.append(
                (path, _STATUS.get(status[0], status), int(old_mode, 8), int(new_mode, 8), old_oid, new_oid)
            )
            i += 2
        numstat = git(self.path, "diff-tree", "-r", "-z", "--no-renames", "--numstat", old, new).stdout
        binary = set()
        for record in numstat.split(b"\0"):
            added, _, rest = record.partition(b"\t")
            deleted, _, raw_path = rest.partition(b"\t")
            if added == b"-" and deleted == b"-":
                binary.add(raw_path.decode("utf-8", "surrogateescape"))
        links = {p: oid for p, _, _, new_mode, _, oid in found if new_mode == SYMLINK}
        targets = {p: data.decode("utf-8", "surrogateescape") for p, data in self.blobs(links).items()}
        return [
            Change(path, status, om, nm, oo, no, path in binary, targets.get(path))
            for path, status, om, nm, oo, no in found
        ]

    def files(self, ref: str) -> dict[str, tuple[int, str]]:
        """``path -> (git mode, blob id)`` of every file and symlink in ``ref``."""
        out = git(self.path, "ls-tree", "-r", "-z", "--full-tree", ref).stdout
        found = {}
        for record in out.split(b"\0"):
            if not record:
                continue
            meta, _, path = record.partition(b"\t")
            mode, kind, oid = meta.decode().split(" ")
            if kind == "blob":
                found[path.decode("utf-8", "surrogateescape")] = (int(mode, 8), oid)
        return found

    def blobs(self, oids: dict[str, str]) -> dict[str, bytes]:
        """The bytes of blobs, by the key each is given under (``git cat-file --batch``)."""
        if not oids:
            return {}
        order = list(oids.items())
        result = git(self.path, "cat-file", "--batch", input=b"".join(o.encode() + b"\n" for _, o in order))
        data, pos, found = result.stdout, 0, {}
        for key, oid in order:
            end = data.index(b"\n", pos)
            header = data[pos:end].split(b" ")
            if len(header) != 3:
                raise HostGitError(f"the shadow repository has no object {oid}")
            size = int(header[2])
            found[key] = data[end + 1 : end + 1 + size]
            pos = end + 1 + size + 1
        return found


class CommitWriter:
    """Feeds ``git fast-import``: :meth:`put` and :meth:`delete` paths, then :meth:`finish`
    writes the commit (on top of ``parent``: only what changes needs to be given)."""

    def __init__(self, shadow: ShadowRepo, ref: str, parent: str | None) -> None:
        self.shadow, self.ref = shadow, ref
        self._ops: list[bytes] = [] if parent is None else [b"from " + parent.encode() + b"\n"]
        self._proc = subprocess.Popen(
            ["git", "-C", str(shadow.path), "fast-import", "--quiet", "--done", "--force"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**environment(), **config_environment(shadow.path)},
        )
        self._mark = 0

    def _write(self, data: bytes) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(data)

    def put(self, path: str, mode: int, data: bytes) -> None:
        """``path`` holds ``data`` (a symlink: its target) with git ``mode``."""
        self._mark += 1
        self._write(b"blob\nmark :%d\ndata %d\n" % (self._mark, len(data)) + data + b"\n")
        self._ops.append(b"M %o :%d " % (mode, self._mark) + quote_path(path) + b"\n")

    def keep(self, path: str, mode: int, oid: str) -> None:
        """``path`` holds the blob ``oid`` already in the repository."""
        self._ops.append(b"M %o %s " % (mode, oid.encode()) + quote_path(path) + b"\n")

    def delete(self, path: str) -> None:
        self._ops.append(b"D " + quote_path(path) + b"\n")

    def finish(self) -> str:
        """Write the commit; its id."""
        ref = self.ref.encode()
        ops = b"".join(self._ops)
        self._write(b"commit " + ref + b"\n" + _COMMITTER + b"data 0\n" + ops + b"\ndone\n")
        assert self._proc.stdin is not None and self._proc.stderr is not None
        self._proc.stdin.close()
        error = self._proc.stderr.read()
        if self._proc.wait(timeout=GIT_TIMEOUT_S) != 0:
            raise HostGitError(f"git fast-import failed: {error.decode('utf-8', 'replace').strip()[-1500:]}")
        return self.shadow.resolve(self.ref)

    def abort(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
