"""A task's git source fetched at one commit (``git fetch --depth 1 URL COMMIT``, every branch
where the server refuses that) into a cache of fetched repositories (one bare repository per URL
under ``CLOVER_HOME/git``), so a commit is fetched once, then checked out into a plain folder.

The URL is untrusted: only ``https://``, ``file://`` and absolute paths (:func:`check_url`); git is
the host's safe git (:mod:`clover_agent.handback.hostgit`) with exactly those transports allowed
(``GIT_ALLOW_PROTOCOL``), no submodules, no tags; a fetched repository's configuration never
travels. Offline, ``https://HOST/owner/name(.git)`` is read from a mirror folder's
``DIR/owner/name.git`` (``--git-mirror DIR`` or ``CLOVER_GIT_MIRROR``).
"""

from __future__ import annotations

import fcntl
import hashlib
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from clover_agent.errors import CloverError, UsageError
from clover_agent.handback.hostgit import HostGitError, git

#: Seconds a fetch may take by default (a large repository's full history over a slow link).
FETCH_TIMEOUT_S = 1800.0
MIRROR_VARIABLE = "CLOVER_GIT_MIRROR"
TIMEOUT_VARIABLE = "CLOVER_GIT_TIMEOUT"
#: The transports a task's source may use: https, and local repositories (mirrors, tests).
ALLOWED_PROTOCOLS = "https:file"
_FULL_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_NETWORK_WORDS = (
    "could not resolve host",
    "failed to connect",
    "connection refused",
    "network is unreachable",
    "connection timed out",
    "couldn't connect to server",
    "temporary failure in name resolution",
    "no route to host",
    "operation timed out",
    "name or service not known",
)


class GitSourceError(CloverError):
    """A task's git source could not be fetched (the URL, the network, the commit)."""


@dataclass(frozen=True)
class GitFetchOptions:
    cache: Path  # the fetched repositories, one bare repository per URL
    mirror: Path | None = None  # https URLs read from DIR/owner/name.git
    timeout_s: float = FETCH_TIMEOUT_S

    @classmethod
    def from_environment(
        cls, home: Path, env: Mapping[str, str], mirror: str | None = None, timeout_s: float | None = None
    ) -> GitFetchOptions:
        """The options from the arguments, else ``CLOVER_GIT_MIRROR`` / ``CLOVER_GIT_TIMEOUT``;
        the cache is ``home/git`` (``home``: ``CLOVER_HOME``)."""
        mirror = mirror or env.get(MIRROR_VARIABLE) or None
        if timeout_s is None and env.get(TIMEOUT_VARIABLE):
            try:
                timeout_s = float(env[TIMEOUT_VARIABLE])
            except ValueError:
                raise UsageError(
                    f"{TIMEOUT_VARIABLE}={env[TIMEOUT_VARIABLE]!r}: not a number of seconds"
                ) from None
            if not timeout_s > 0:
                raise UsageError(f"{TIMEOUT_VARIABLE}: seconds above 0, not {timeout_s:g}")
        return cls(
            cache=home / "git",
            mirror=Path(mirror).expanduser() if mirror else None,
            timeout_s=timeout_s or FETCH_TIMEOUT_S,
        )


def check_url(url: str) -> str:
    """``url`` if it is an ``https://`` or ``file://`` URL or an absolute local path; else a
    :class:`GitSourceError` saying why (an option, a transport helper such as ``ext::``, another
    scheme, ``host:path``, control characters)."""
    shown = repr(url)
    if not url or url.startswith("-"):
        raise GitSourceError(f"git source {shown}: not a repository URL (it would be read as an option)")
    if any(ord(c) < 32 or ord(c) == 127 for c in url):
        raise GitSourceError(f"git source {shown}: control characters in a URL")
    if "::" in url:
        raise GitSourceError(
            f"git source {shown}: a transport helper (`{url.split('::', 1)[0]}::`) is never run; "
            "give an https:// URL or a local path"
        )
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", url)
    if scheme:
        if scheme.group(1).lower() not in ("https", "file"):
            raise GitSourceError(
                f"git source {shown}: the {scheme.group(1)}:// transport is not allowed (https:// or file:// only)"
            )
        return url
    if not url.startswith("/"):
        raise GitSourceError(
            f"git source {shown}: not an https:// or file:// URL nor an absolute path "
            "(`host:path` would be ssh, which is not allowed)"
        )
    return url


def mirror_path(url: str, mirror: Path) -> Path:
    """Where ``url`` (an https URL) lives in the mirror folder: ``mirror/owner/name.git``."""
    path = urlsplit(url).path.strip("/")
    parts = [p for p in path.removesuffix(".git").split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise GitSourceError(f"git source {url!r}: no repository path to look up in the mirror {mirror}")
    return mirror.joinpath(*parts[:-1], parts[-1] + ".git")


def _cache_dir(url: str, cache: Path) -> Path:
    tail = (
        re.sub(r"[^A-Za-z0-9_.-]+", "-", url.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git"))[:60]
        or "repo"
    )
    return cache / f"{tail}-{hashlib.sha256(url.encode()).hexdigest()[:16]}.git"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One fetch into a cached repository at a time (tasks of one repository run side by side)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _network_problem(said: str) -> bool:
    low = said.lower()
    return any(word in low for word in _NETWORK_WORDS)


def _offline_message(url: str, said: str) -> str:
    host = urlsplit(url).hostname or url
    return (
        f"cannot fetch {url}: {host} cannot be reached (the network is unreachable or the host is "
        f"unknown; git said: {said.strip().splitlines()[-1] if said.strip() else 'nothing'}). Offline, "
        f"point at a local mirror: --git-mirror DIR or {MIRROR_VARIABLE}=DIR, where DIR/owner/name.git "
        "is made with `git clone --mirror URL DIR/owner/name.git`"
    )


def fetch(url: str, commit: str, options: GitFetchOptions) -> tuple[Path, str]:
    """The cached bare repository holding ``commit`` of ``url`` (fetched unless it is already
    there), and the commit's full id. ``commit`` "": the remote's default branch."""
    check_url(url)
    if (
        commit.startswith("-")
        or any(c.isspace() or ord(c) < 32 or c in ":^~" for c in commit)
        or ".." in commit
    ):
        raise GitSourceError(f"git source {url!r}: {commit!r} is not a revision")
    cache = _cache_dir(url, options.cache)
    with _locked(cache.with_name(cache.name + ".lock")):
        if not (cache / "HEAD").is_file():
            shutil.rmtree(cache, ignore_errors=True)
            cache.mkdir(parents=True)
            _git(cache, options, "init", "-q", "--bare")
        if _FULL_ID.fullmatch(commit) and _has_commit(cache, commit, options):
            return cache, commit
        remote = url
        if options.mirror is not None and url.lower().startswith("https://"):
            local = mirror_path(url, options.mirror)
            if not local.is_dir():
                raise GitSourceError(
                    f"{url}: the mirror has no {local} (--git-mirror / {MIRROR_VARIABLE}: "
                    f"`git clone --mirror {url} {local}` makes it)"
                )
            remote = str(local.resolve())
        env = {"GIT_ALLOW_PROTOCOL": ALLOWED_PROTOCOLS}
        fetch_args = ("fetch", "-q", "--no-tags", "--no-recurse-submodules", "--no-write-fetch-head")
        shallow = _git(
            cache,
            options,
            *fetch_args[:-1],
            "--depth",
            "1",
            "--",
            remote,
            commit or "HEAD",
            env=env,
            check=False,
        )
        said = shallow.stderr.decode("utf-8", "replace")
        if shallow.returncode == 0:
            full = _rev(cache, "FETCH_HEAD", options)
        elif _network_problem(said):
            raise GitSourceError(_offline_message(url, said))
        else:  # the server does not give a commit by its id, or an abbreviated id: every branch
            every = _git(
                cache,
                options,
                *fetch_args,
                "--",
                remote,
                "+refs/heads/*:refs/remotes/origin/*",
                env=env,
                check=False,
            )
            said = every.stderr.decode("utf-8", "replace")
            if every.returncode != 0:
                if _network_problem(said):
                    raise GitSourceError(_offline_message(url, said))
                raise GitSourceError(f"cannot fetch {url}: {said.strip()[-1500:] or 'git failed'}")
            rev = commit or "refs/remotes/origin/HEAD"
            if not commit:
                heads = _git(
                    cache, options, "for-each-ref", "--format=%(refname)", "refs/remotes/origin/"
                ).stdout
                names = heads.decode("utf-8", "replace").split()
                rev = next(
                    (n for n in ("refs/remotes/origin/main", "refs/remotes/origin/master") if n in names), ""
                )
                if not rev:
                    raise GitSourceError(f"{url}: no commit given and no main or master branch")
            elif not _FULL_ID.fullmatch(commit):
                branch = f"refs/remotes/origin/{commit}"
                rev = branch if _has_commit(cache, branch, options) else commit
            try:
                full = _rev(cache, rev, options)
            except GitSourceError:
                raise GitSourceError(f"{url}: has no commit {commit!r}") from None
        _git(cache, options, "update-ref", f"refs/clover/{full}", full)  # kept: a later run finds it
        return cache, full


def checkout(cache: Path, commit: str, dest: Path, options: GitFetchOptions) -> None:
    """The tree of ``commit`` (a full id in ``cache``) written into a new folder ``dest`` (its own
    ``.git`` borrowing the cache's objects, removed after)."""
    dest.mkdir(parents=True)
    _git(dest, options, "init", "-q")
    (dest / ".git" / "objects" / "info" / "alternates").write_text(str((cache / "objects").resolve()) + "\n")
    _git(dest, options, "checkout", "-q", "--detach", commit)
    shutil.rmtree(dest / ".git")


def _has_commit(cache: Path, rev: str, options: GitFetchOptions) -> bool:
    return _git(cache, options, "cat-file", "-e", f"{rev}^{{commit}}", check=False).returncode == 0


def _rev(cache: Path, rev: str, options: GitFetchOptions) -> str:
    result = _git(
        cache, options, "rev-parse", "--verify", "-q", "--end-of-options", f"{rev}^{{commit}}", check=False
    )
    if result.returncode != 0:
        raise GitSourceError(f"{rev}: not a commit")
    return result.stdout.decode().strip()


def _git(
    cwd: Path, options: GitFetchOptions, *args: str, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[bytes]:
    try:
        return git(cwd, *args, env=env, check=check, timeout=options.timeout_s)
    except HostGitError as exc:
        raise GitSourceError(str(exc)) from exc


__all__ = [
    "ALLOWED_PROTOCOLS",
    "FETCH_TIMEOUT_S",
    "GitFetchOptions",
    "GitSourceError",
    "check_url",
    "checkout",
    "fetch",
    "mirror_path",
]
