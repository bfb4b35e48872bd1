"""The host's own stock of a sandbox's workspace: which files it holds, with their bytes, decided
on the host.

:func:`take_snapshot` asks the sandbox's runner for the raw facts (``Sandbox.tree``: every entry
with its kind, mode, size and sha256) and decides here, with a clean host git
(:mod:`~clover_agent.handback.hostgit`), which of them git would track; what is never read is
:attr:`Snapshot.left_out`, with why. :func:`file_bytes` then reads the files' bytes, from the
user's tree where it holds the same bytes and from the sandbox otherwise, in bounded batches.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import posixpath
import stat
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from clover_agent.handback.hostgit import HostGitError, git, z_list
from clover_agent.safe_text import shown_names, terminal_safe
from clover_agent.sandboxes.base import Sandbox, TreeEntry
from clover_agent.sandboxes.session import READ_BATCH_BYTES

#: Never part of a patch (caches tools write beside the code), unless the user tracks them.
BUILTIN_EXCLUDES = b"__pycache__/\n*.py[co]\n.pytest_cache/\n.mypy_cache/\n.ruff_cache/\n"
#: What test runs and their tools write beside the code (``fnmatch`` patterns on a name, with what
#: it is): left out of a patch unless the user tracks it, and named (:attr:`Snapshot.left_out`), so a
#: suite that writes coverage data on every run (``--cov`` in its pytest options, ``parallel =
#: true``) does not hand back hundreds of binary files. Folders are not even entered.
GENERATED_FILES = (
    (".coverage", "coverage data"),
    (".coverage.*", "coverage data"),
    ("coverage.xml", "a coverage report"),
    ("junit.xml", "a test report"),
    ("junit-*.xml", "a test report"),
)
GENERATED_FOLDERS = (
    ("htmlcov", "a coverage report"),
    (".hypothesis", "Hypothesis's example database"),
    (".tox", "tox's environments"),
    (".nox", "nox's environments"),
)
#: How the reason of a generated file left out begins (:func:`generated_reason`).
GENERATED_NOTE = "written by test runs, not part of the change"
#: More files than this left out for one such reason are shown as one line.
GROUP_AT = 3
#: A ``.gitignore`` larger than this is not read (none real is).
MAX_IGNORE_FILE_BYTES = 1024 * 1024


@dataclass
class Snapshot:
    """The files and symlinks a workspace holds (``entries``, by relative path) and what was left
    out of it and why (``left_out``: special files, nested repositories, unreadable entries)."""

    entries: dict[str, TreeEntry]
    left_out: dict[str, str] = field(default_factory=dict)

    def differs(self, path: str, other: Snapshot) -> bool:
        """Whether ``path`` is not the same here and in ``other`` (kind, bytes, executable bit)."""
        mine, theirs = self.entries.get(path), other.entries.get(path)
        return (mine and signature(mine)) != (theirs and signature(theirs))


def signature(entry: TreeEntry) -> tuple[object, ...]:
    """What makes two entries the same for git: a link's target, a file's bytes and exec bit."""
    if entry.kind == "link":
        return ("link", entry.target)
    return ("file", entry.sha256, bool(entry.mode & 0o100))


def user_excludes(repo: Path) -> bytes:
    """The ignore patterns of ``repo`` that live outside its tree: ``info/exclude`` and the
    global excludes file (``core.excludesFile``, default ``~/.config/git/ignore``). Only
    configuration is read here (nothing runs)."""
    parts = []
    info = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--path-format=absolute", "--git-path", "info/exclude"],
        capture_output=True,
        check=False,
    )
    configured = subprocess.run(
        ["git", "-C", str(repo), "config", "--path", "--get", "core.excludesFile"],
        capture_output=True,
        check=False,
    )
    candidates = [info.stdout.strip()] if info.returncode == 0 else []
    if configured.returncode == 0 and configured.stdout.strip():
        candidates.append(configured.stdout.strip())
    else:  # git's default (when XDG_CONFIG_HOME is not set)
        candidates.append(os.fsencode(Path.home() / ".config" / "git" / "ignore"))
    for candidate in candidates:
        try:
            with open(candidate, "rb") as f:
                parts.append(f.read(MAX_IGNORE_FILE_BYTES))
        except OSError:
            continue
    return b"\n".join(parts) + b"\n"


def tracked_files(repo: Path) -> set[str]:
    """The paths ``repo``'s index tracks, relative to ``repo`` (a subfolder of a work tree: its
    part), by a clean host git; empty when ``repo`` is not in a git work tree."""
    result = git(repo, "ls-files", "-z", "--cached", "--full-name", check=False)
    if result.returncode != 0:
        return set()
    prefix = (
        git(repo, "rev-parse", "--show-prefix", check=False).stdout.decode("utf-8", "surrogateescape").strip()
    )
    paths = z_list(result.stdout)
    return {p[len(prefix) :] for p in paths if p.startswith(prefix)} if prefix else set(paths)


def generated_reason(path: str, *, folder: bool) -> str | None:
    """Why ``path`` (a folder when ``folder``) is left out as something test runs write
    (:data:`GENERATED_FILES`, :data:`GENERATED_FOLDERS`), or None."""
    name = posixpath.basename(path)
    for pattern, what in GENERATED_FOLDERS if folder else GENERATED_FILES:
        if fnmatch.fnmatchcase(name, pattern):
            return f"{what}, {GENERATED_NOTE}"
    return None


def left_out_lines(left_out: dict[str, str]) -> list[str]:
    """One terminal-safe line per left-out path, ``"path: why"``, except that more than
    :data:`GROUP_AT` left out for the same reason of something test runs write become one
    (``"425 files (.coverage.a, .coverage.b, ...): coverage data, written by ..."``); the full
    list stays in ``summary.json``."""
    groups: dict[str, list[str]] = {}
    for path, why in left_out.items():
        groups.setdefault(why, []).append(path)
    lines = []
    for why, paths in groups.items():
        reason = terminal_safe(why, single_line=True)
        if GENERATED_NOTE in why and len(paths) > GROUP_AT:
            lines.append(f"{len(paths)} files ({shown_names(paths[:2])}, ...): {reason}")
        else:
            lines.extend(f"{shown_names([path])}: {reason}" for path in paths)
    return lines


def _under(path: str, folders: set[str]) -> bool:
    parts = path.split("/")
    return any("/".join(parts[:i]) in folders for i in range(1, len(parts)))


async def take_snapshot(sandbox: Sandbox, *, excludes: bytes, keep: set[str], scratch: Path) -> Snapshot:
    """The workspace's files as git would track them.

    - ``excludes``: :func:`user_excludes`.
    - ``keep``: paths that always count, even if ignored (tracked by the user, or in the starting state).
    - ``scratch``: an empty folder for the skeleton the ignore rules are evaluated in.

    The sandbox reports every entry (``.git`` left out, symlinks never followed). Which count is decided
    by the repository's ignore rules, evaluated by a clean host git over a skeleton of the workspace's
    folders and ``.gitignore`` files, plus the user's own ``info/exclude`` and global excludes and
    :data:`BUILTIN_EXCLUDES`. Ignored folders are not even entered (a whole virtual environment costs
    one line).

    Never read, and listed with why in :attr:`Snapshot.left_out`: FIFOs, sockets, devices, nested
    repositories, unreadable entries and what test runs write (:func:`generated_reason`; a folder of it
    not entered).
    """
    skeleton = scratch / "skeleton"
    skeleton.mkdir(parents=True)
    git(skeleton, "init", "-q", "--template=")
    (skeleton / ".git" / "info").mkdir(exist_ok=True)
    (skeleton / ".git" / "info" / "exclude").write_bytes(excludes + b"\n" + BUILTIN_EXCLUDES)
    outline = await sandbox.tree(dirs_only=True)
    folders = [e.path for e in outline if e.kind == "dir"]
    for folder in folders:
        (skeleton / folder).mkdir(parents=True, exist_ok=True)
    ignore_files = [e.path for e in outline if e.kind == "file" and e.size <= MAX_IGNORE_FILE_BYTES]
    for path, data in (await sandbox.read_files(ignore_files)).items():
        if isinstance(data, bytes):
            (skeleton / path).write_bytes(data)
    ignored_folders = set(_check_ignore(skeleton, folders))
    kept_parents = {"/".join(p.split("/")[:i]) for p in keep for i in range(1, p.count("/") + 1)}
    generated = {f: why for f in folders if (why := generated_reason(f, folder=True)) is not None}
    generated = {f: why for f, why in generated.items() if f not in kept_parents and f not in ignored_folders}
    prune = {f for f in ignored_folders if f not in kept_parents} | set(generated)
    prune = {f for f in prune if not _under(f, prune)}  # the topmost ones
    listed = await sandbox.tree(prune=sorted(prune), hashes=True)
    candidates = [e for e in listed if e.kind != "dir" and not _under(e.path, prune)]
    ignored = set(_check_ignore(skeleton, [e.path for e in candidates if e.path not in keep]))
    snapshot = Snapshot({})
    snapshot.left_out.update({f: why for f, why in generated.items() if f in prune})
    for entry in candidates:
        if entry.path in ignored:
            continue
        why = None if entry.path in keep else generated_reason(entry.path, folder=False)
        if why is not None:
            snapshot.left_out[entry.path] = why
            continue
        if entry.kind in ("file", "link"):
            snapshot.entries[entry.path] = entry
        elif entry.kind == "special":
            snapshot.left_out[entry.path] = f"a {entry.target or 'special file'}: never read or handed back"
        elif entry.kind == "repo":
            snapshot.left_out[entry.path] = "a nested git repository: its changes are not handed back"
        else:
            snapshot.left_out[entry.path] = "could not be read in the sandbox"
    return snapshot


def _check_ignore(skeleton: Path, paths: list[str]) -> list[str]:
    """Which of ``paths`` the skeleton's ignore rules ignore (``git check-ignore``)."""
    if not paths:
        return []
    data = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths)
    result = git(skeleton, "check-ignore", "-z", "--stdin", input=data, check=False)
    if result.returncode not in (0, 1):  # 1: none is ignored
        said = result.stderr.decode("utf-8", "replace").strip()[-1500:]
        raise HostGitError(f"git check-ignore failed on the workspace's ignore rules: {said}")
    return z_list(result.stdout)


def host_file(repo: Path, path: str) -> bytes | None:
    """The bytes of the regular file ``path`` in the user's tree, or None (missing, a symlink, a
    FIFO, or inside a linked folder: nothing is followed)."""
    try:
        fd = os.open(
            repo / path,
            os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0),
        )
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        if Path(os.path.realpath(repo / path)) != repo.resolve() / path:
            return None  # reached through a symlinked folder
        return f.read()


async def file_bytes(
    sandbox: Sandbox, entries: list[TreeEntry], *, repo: Path | None = None
) -> AsyncIterator[tuple[TreeEntry, bytes]]:
    """Each file entry's bytes (a link's: its target), checked against the sha256 the sandbox
    reported; from ``repo`` (the user's tree) when its file has those bytes, else from the
    sandbox, at most :data:`READ_BATCH_BYTES` at a time. A file the sandbox cannot read or whose
    bytes changed meanwhile raises ``OSError``."""
    batch: list[TreeEntry] = []
    size = 0
    for entry in entries:
        if entry.kind == "link":
            yield entry, os.fsencode(entry.target or "")
            continue
        local = host_file(repo, entry.path) if repo is not None else None
        if local is not None and hashlib.sha256(local).hexdigest() == entry.sha256:
            yield entry, local
            continue
        if batch and size + entry.size > READ_BATCH_BYTES:
            for item in await _read_batch(sandbox, batch):
                yield item
            batch, size = [], 0
        batch.append(entry)
        size += entry.size
    if batch:
        for item in await _read_batch(sandbox, batch):
            yield item


async def _read_batch(sandbox: Sandbox, batch: list[TreeEntry]) -> list[tuple[TreeEntry, bytes]]:
    found = await sandbox.read_files([e.path for e in batch])
    out = []
    for entry in batch:
        data = found.get(entry.path)
        if not isinstance(data, bytes):
            raise OSError(f"{entry.path}: {data or 'not read'}")
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            raise OSError(f"{entry.path} changed while it was read")
        out.append((entry, data))
    return out
