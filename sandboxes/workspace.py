"""The workspace copy: which files of the user's repository go into a sandbox, and its git baseline.

The sandbox gets the repository as the user has it right now: tracked files with their uncommitted
changes, untracked files that are not ignored, and ``.git`` with its configuration rewritten
without credentials (:mod:`clover_agent.sandboxes.git_config`); a folder that is not a git
repository is copied whole, and the user's tree is only read. A baseline commit in the sandbox
records that state, so ``git diff BASE`` shows exactly what the agent changed. The repository is
scanned once (:func:`plan_workspace`) and checked against the disk limit before anything is
copied; sparse files stay sparse (:class:`SparseFile`). Details: sandboxes/README.md.
"""

from __future__ import annotations

import errno
import io
import logging
import os
import shutil
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from clover_agent.environments.files import git_ls_files, listed_files
from clover_agent.sandboxes.base import SandboxError
from clover_agent.sandboxes.git_config import is_config_file, sandbox_config

log = logging.getLogger(__name__)

#: A file whose holes add up to at least this is copied as a sparse file.
SPARSE_MIN_HOLE = 1024 * 1024
#: The sandbox's file systems allocate whole pages: how much a file of N bytes takes, roughly.
_PAGE = 4096

#: Git options for the commits clover-agent makes in a workspace (baseline, checkpoints): its own
#: identity, never signed.
GIT_IDENTITY = "-c user.name=clover-agent -c user.email=clover-agent@localhost -c commit.gpgsign=false"

#: Prints the baseline commit of ``/workspace`` (creating the repository and commit if needed).
BASELINE_SCRIPT = f"""set -e
cd "$WORKSPACE"
if [ ! -w . ]; then
  echo "the workspace $WORKSPACE is not writable by uid $(id -u): the image must provide it" \
    "(build custom images FROM clover-agent-sandbox:latest)" >&2
  exit 3
fi
[ -d .git ] || git init -q
# The copy's own git never runs the repository's programs: no hooks, no fsmonitor, and no filter
# or text conversion drivers (their commands are the user's machine's, absent here, and a
# required filter would fail every `git add`). Only the sandbox's copy is changed.
git config core.hooksPath /dev/null
git config core.fsmonitor false
attributes=$(git rev-parse --git-path info/attributes)
mkdir -p "$(dirname "$attributes")"
printf '%s\n' "# clover-agent: no filter or diff drivers in the sandbox" "* !filter !diff" >> "$attributes"
if [ -n "${{CLOVER_KEEP_OUT:-}}" ]; then  # sparse files: git would read (and on tmpfs allocate) them whole
  exclude=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$exclude")"
  printf '%s\\n' "# clover-agent: sparse files of the workspace, kept out of git" "$CLOVER_KEEP_OUT" >> "$exclude"
fi
git add -A
if ! git rev-parse -q --verify HEAD >/dev/null || ! git diff --cached --quiet; then
  git {GIT_IDENTITY} commit -q --no-verify --allow-empty -m "clover-agent: starting state"
fi
git rev-parse HEAD
"""


def copy_index_command(source: str, dest: str) -> str:
    """Shell command copying the git index ``source`` to ``dest`` (shell words) for a throwaway
    ``git add -A`` that compares the content of every file it caches, never trusting the cached stat data.

    Without an index to copy, ``dest`` is removed (git starts from an empty one).

    Why: git's stat data has whole-second times, so a file rewritten with the same size in the second
    its entry was cached still matches it. Git guards against that ("racily clean" entries) by
    comparing content for entries not older than the index file itself, but a plain copy gets a fresh
    time, loses the guard, and so would miss the change. Dating the copy to second 1 of 1970 makes
    every entry racily clean.

    Not instead:

    - second 0: git reads a zero index time as unknown and then skips the guard altogether;
    - ``cp -p`` (keeping the guard as git has it): it still trusts stat for entries older than the
      index, which a tool restoring old times (tar, ``cp -p``, rsync) can fool;
    - an empty index: it would drop tracked files that match ``.gitignore``.

    Cost, measured on 2,000 files (8 MB): ~35 ms per ``git add -A`` instead of ~7; it grows with the
    bytes tracked (~2 ms per MB), small next to a model turn.
    """
    return f"{{ cp {source} {dest} && TZ=UTC0 touch -t 197001010000.01 {dest}; }} 2>/dev/null || rm -f {dest}"


def add_all_command(errors: str) -> str:
    """Shell lines running ``git add -A .`` into the current ``GIT_INDEX_FILE`` that leave out
    what git cannot index (a nested repository with no commit, a file it may not read) instead of
    failing, and keep git's warnings off the output (``errors``: a file for them, removed after);
    any other error still fails. The host's own stock names what is left out
    (``clover_agent.handback.snapshot``), so a checkpoint or a recorded diff lacking it loses nothing."""
    return f"""if ! git add -A --ignore-errors . 2>{errors}; then
  if grep -v -e '^error: ' -e '^warning: ' -e '^hint: ' -e '^fatal: adding files failed$' \\
      -e ': Permission denied$' {errors} >&2; then
    rm -f {errors}; exit 1
  fi
fi
rm -f {errors}
"""


#: How the workspace's diff is printed from an index holding its files (see :func:`diff_script`).
DIFF_COMMAND = "git diff --cached --binary --no-ext-diff --no-textconv --no-color"


def diff_script(base: str) -> str:
    """Shell script printing the binary-safe diff of the workspace against ``base``, new files
    included, through a throwaway index so the agent's own staging is left alone. It is the
    trajectory's record of the workspace (what a resumed run restores), never the patch handed back
    (the host computes that itself: ``clover_agent.handback.stock``)."""
    return f"""set -e
cd "$WORKSPACE"
index=$(mktemp)
trap 'rm -f "$index"' EXIT
{copy_index_command(".git/index", '"$index"')}
export GIT_INDEX_FILE=$index
{add_all_command('"$index.err"')}{DIFF_COMMAND} {base}
"""


#: A copy this large is worth telling the user about (with the ``.git`` folder's share).
LARGE_COPY_BYTES = 20 * 1024**2


def workspace_paths(repo: str | os.PathLike[str]) -> Iterator[tuple[Path, str]]:
    """Yield ``(host path, relative path)`` for everything the sandbox copy holds, parents first.

    Files deleted in the work tree but still tracked are skipped (the copy shows them deleted).
    """
    root = Path(repo).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"repository folder not found: {root}")
    listed = listed_files(root)
    if listed is None:
        yield from _walk_below(root, root)
        return
    git_dir = root / ".git"
    if git_dir.is_dir() and not git_dir.is_symlink():
        yield git_dir, ".git"
        yield from _walk_below(root, git_dir)
    seen_dirs: set[str] = set()
    for rel in listed:
        path = root / rel
        if not os.path.lexists(path):
            continue
        parts = rel.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent not in seen_dirs:
                seen_dirs.add(parent)
                yield root / parent, parent
        if path.is_dir() and not path.is_symlink():  # a submodule: copy it whole
            seen_dirs.add(rel)
            yield path, rel
            yield from _walk_below(root, path)
        else:
            yield path, rel


def _walk_below(root: Path, top: Path) -> Iterator[tuple[Path, str]]:
    """Everything under ``top`` (not ``top`` itself), parents first, paths relative to ``root``."""
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        base = Path(dirpath)
        for name in dirnames + sorted(filenames):
            path = base / name
            yield path, path.relative_to(root).as_posix()


@dataclass
class SparseFile:
    """A sparse file of the workspace: its size and the ``(offset, length)`` runs holding data.
    ``tracked`` ones are read whole by git anyway; untracked ones are kept out of git."""

    rel: str
    path: Path
    size: int
    mode: int
    segments: list[tuple[int, int]]
    tracked: bool = False

    @property
    def data_bytes(self) -> int:
        return sum(length for _, length in self.segments)


def data_segments(fd: int, size: int) -> list[tuple[int, int]]:
    """The ``(offset, length)`` runs of ``fd`` that hold data (``SEEK_DATA``/``SEEK_HOLE``); the
    whole file as one run where the file system cannot say."""
    segments: list[tuple[int, int]] = []
    pos = 0
    try:
        while pos < size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # only a hole is left
                    break
                raise
            end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
            segments.append((start, end - start))
            pos = end
    except (OSError, AttributeError):  # no SEEK_DATA here: treat the file as dense
        return [(0, size)]
    return segments


def sparse_file(path: Path, rel: str, st: os.stat_result) -> SparseFile | None:
    """The file as a :class:`SparseFile` when its holes add up to :data:`SPARSE_MIN_HOLE`, else None."""
    if st.st_size <= SPARSE_MIN_HOLE or st.st_blocks * 512 >= st.st_size - SPARSE_MIN_HOLE:
        return None  # allocated nearly whole: cannot have that much hole
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        segments = data_segments(fd, st.st_size)
    finally:
        os.close(fd)
    found = SparseFile(rel, path, st.st_size, stat.S_IMODE(st.st_mode), segments)
    return found if st.st_size - found.data_bytes >= SPARSE_MIN_HOLE else None


def read_segment(path: Path, offset: int, length: int, chunk: int) -> Iterator[tuple[int, bytes]]:
    """``(offset, bytes)`` pieces of at most ``chunk`` bytes covering ``length`` bytes at ``offset``."""
    with path.open("rb") as f:
        f.seek(offset)
        while length > 0:
            data = f.read(min(chunk, length))
            if not data:
                return  # the file shrank meanwhile
            yield offset, data
            offset += len(data)
            length -= len(data)


@dataclass
class WorkspacePlan:
    """What the sandbox copy of a repository holds, scanned once before anything is copied."""

    entries: list[tuple[Path, str, os.stat_result]]  # parents first; no FIFOs, sockets, devices
    sparse: dict[str, SparseFile]  # by relative path
    size: int  # bytes it takes in the sandbox, in whole pages (holes of untracked files not counted)
    files: int
    git_size: int = 0  # the part of ``size`` that is the .git folder
    #: The git configuration files, by relative path, as the sandbox gets them (no credentials).
    rewritten: dict[str, bytes] = field(default_factory=dict)

    def describe(self) -> str:
        """The copy's size for the user ("69 MB in 1,234 files, the .git folder 40 MB")."""
        mb = 1024**2
        return (
            f"{self.size / mb:.0f} MB in {self.files:,} files (the .git folder: {self.git_size / mb:.0f} MB)"
        )

    @property
    def keep_out(self) -> list[str]:
        """Patterns (for ``.git/info/exclude``) naming the untracked sparse files."""
        return [
            _exclude_pattern(s.rel)
            for s in self.sparse.values()
            if not s.tracked and "\n" not in s.rel and not s.rel.startswith(".git/")
        ]

    def check_size(self, limit: int) -> None:
        """Raise :class:`SandboxError` when the copy would not fit in ``limit`` bytes."""
        if self.size > limit:
            raise SandboxError(
                f"the repository's files ({self.files:,} files, {self.size / 2**30:.2f} GiB with the .git "
                f"folder) do not fit in the sandbox's disk limit of {limit / 2**30:.2f} GiB; raise the "
                "limit (SandboxLimits.disk_bytes) or make the work tree smaller (ignored files are not copied)"
            )


def _exclude_pattern(rel: str) -> str:
    """A gitignore pattern matching exactly the file ``rel`` of the work tree."""
    body = "".join("\\" + ch if ch in "\\*?[" else ch for ch in rel)
    stripped = body.rstrip(" ")
    return "/" + stripped + "\\ " * (len(body) - len(stripped))


def plan_workspace(repo: str | os.PathLike[str]) -> WorkspacePlan:
    """Scan ``repo`` for its workspace copy: entries, sparse files, and the size it takes. Git reads
    tracked files whole (so they count whole); untracked sparse files count by their data."""
    root = Path(repo).resolve()
    listed = git_ls_files(root, "--others")
    untracked = None if listed is None else set(listed)
    entries, sparse, size, files, git_size = [], {}, 0, 0, 0
    for path, rel in workspace_paths(root):
        try:
            st = path.lstat()
        except OSError:
            continue
        if not (stat.S_ISLNK(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            continue  # sockets, fifos, devices
        entries.append((path, rel, st))
        if not stat.S_ISREG(st.st_mode):
            continue
        files += 1
        found = sparse_file(path, rel, st)
        counted = st.st_size
        if found is not None:
            found.tracked = untracked is not None and rel not in untracked and not rel.startswith(".git/")
            sparse[rel] = found
            counted = st.st_size if found.tracked else found.data_bytes
        pages = -(-counted // _PAGE) * _PAGE
        size += pages
        if rel.startswith(".git/"):
            git_size += pages
    return WorkspacePlan(entries, sparse, size, files, git_size, _rewrite_git_config(entries))


def _rewrite_git_config(entries: list[tuple[Path, str, os.stat_result]]) -> dict[str, bytes]:
    """The credential-free versions of the git configuration files among ``entries`` (see
    :mod:`clover_agent.sandboxes.git_config`), by relative path. Files under a ``.git`` folder
    that one of them names (an include, a ``store`` helper's file) are taken out of ``entries``."""
    rewritten, named, left_out = {}, set(), 0
    for path, rel, st in entries:
        if ".git" in rel.split("/")[:-1] and not stat.S_ISDIR(st.st_mode) and is_config_file(path):
            config = sandbox_config(path, rel)
            rewritten[rel] = config.text
            named.update(config.named)
            left_out += len(config.left_out)
    if left_out:
        log.info(
            "the sandbox's git configuration leaves out %d setting(s): credentials, includes, programs",
            left_out,
        )
    entries[:] = [
        entry
        for entry in entries
        if entry[1] in rewritten or entry[0] not in named or ".git" not in entry[1].split("/")[:-1]
    ]
    return rewritten


def copy_workspace(plan: WorkspacePlan, dest: str | os.PathLike[str]) -> None:
    """Copy the planned workspace into the existing folder ``dest`` (symlinks kept, sparse files
    written sparse)."""
    target = Path(dest)
    for path, rel, st in plan.entries:
        out = target / rel
        if rel in plan.rewritten:
            out.write_bytes(plan.rewritten[rel])
        elif stat.S_ISLNK(st.st_mode):
            out.symlink_to(os.readlink(path))
        elif stat.S_ISDIR(st.st_mode):
            out.mkdir(exist_ok=True)
            shutil.copymode(path, out)
        elif rel not in plan.sparse:
            shutil.copy2(path, out)
        else:
            sparse = plan.sparse[rel]
            with out.open("wb") as f:
                f.truncate(sparse.size)
                for start, length in sparse.segments:
                    for offset, data in read_segment(path, start, length, 8 << 20):
                        os.pwrite(f.fileno(), data, offset)
            shutil.copystat(path, out)


def write_workspace_tar(plan: WorkspacePlan, out: BinaryIO, *, uid: int, gid: int) -> list[SparseFile]:
    """Write an uncompressed tar of the planned workspace to ``out``, every entry owned by
    ``uid:gid``; sparse files go in empty and are returned, for their data to be written in place."""
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, rel, st in plan.entries:
            if rel in plan.rewritten:
                info = tarfile.TarInfo(rel)
                info.size, info.mode, info.mtime = len(plan.rewritten[rel]), 0o644, int(st.st_mtime)
            else:
                try:
                    info = tar.gettarinfo(str(path), arcname=rel)
                except OSError:
                    continue  # gone since the scan
            info.uid, info.gid, info.uname, info.gname = uid, gid, "", ""
            if rel in plan.rewritten:
                tar.addfile(info, io.BytesIO(plan.rewritten[rel]))
            elif info.isreg() and rel in plan.sparse:
                info.size = 0
                tar.addfile(info)
            elif info.isreg():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return list(plan.sparse.values())
