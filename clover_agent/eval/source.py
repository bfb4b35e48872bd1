"""A task's repository on the host: a pinned sdist from the package index, a folder or a git URL
at a commit (:mod:`clover_agent.eval.gitsource`: fetched once into a cache of repositories), made
a git repository whose one commit is the code as released (a user's checkout), kept under the
eval's output folder so a resumed eval fetches nothing again."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import ssl
import tarfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

from clover_agent.environments.recipe import PackageIndex
from clover_agent.errors import CloverError
from clover_agent.eval.gitsource import GitFetchOptions, GitSourceError, checkout, fetch
from clover_agent.eval.tasks import RepoSource
from clover_agent.handback.hostgit import HostGitError, git

INDEX_TIMEOUT_S = 120
_IDENTITY = ("-c", "user.name=clover-agent eval", "-c", "user.email=eval@clover-agent.invalid")


class SourceError(CloverError):
    """The repository of a task could not be made (the index, the archive, the folder, git)."""


def commit_all(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, *_IDENTITY, "commit", "-q", "--allow-empty", "--no-verify", "-m", message)


def default_git_options() -> GitFetchOptions:
    """The git options from this process's environment (``CLOVER_HOME``'s cache, the mirror and
    the timeout variables)."""
    env = os.environ
    home = env.get("CLOVER_HOME") or str(
        Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "clover-agent"
    )
    return GitFetchOptions.from_environment(Path(home).expanduser(), env)


def make_repo(
    source: RepoSource, dest: Path, index: PackageIndex, git_options: GitFetchOptions | None = None
) -> Path:
    """``dest`` made the repository ``source`` names, with one commit (``dest`` must not exist);
    ``git_options``: where a git source is cached and mirrored (default: from the environment)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        if source.kind == "sdist":
            _unpack_sdist(source.value, partial, index)
        elif source.kind == "path":
            folder = Path(source.value)
            if not folder.is_dir():
                raise SourceError(f"repo.path {folder}: no such folder")
            shutil.copytree(folder, partial, symlinks=True, ignore=shutil.ignore_patterns(".git", ".clover"))
        else:
            options = git_options or default_git_options()
            cache, commit = fetch(source.value, source.commit, options)
            checkout(cache, commit, partial, options)
        git(partial, "init", "-q", "-b", "main")
        commit_all(partial, f"{source.describe()} as released")
    except GitSourceError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise SourceError(str(exc)) from exc
    except HostGitError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise SourceError(f"{source.describe()}: git failed: {exc}") from exc
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    partial.rename(dest)
    return dest


def _unpack_sdist(spec: str, dest: Path, index: PackageIndex) -> None:
    name, version = spec.split("==")
    root = (index.index_url or "https://pypi.org/simple/").rstrip("/")
    context = ssl.create_default_context(
        cadata=index.ca_bundle.decode("ascii", "replace") if index.ca_bundle else None
    )
    normalized = re.sub(r"[-_.]+", "-", name).lower()
    url = f"{root}/{normalized}/"
    request = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=INDEX_TIMEOUT_S, context=context) as response:
            files = json.load(response)["files"]
        wanted = {
            f"{stem}-{version}{ext}".lower()
            for stem in (name, normalized, normalized.replace("-", "_"))
            for ext in (".tar.gz", ".zip")
        }
        entry = next((f for f in files if f["filename"].lower() in wanted), None)
        if entry is None:
            raise SourceError(f"{spec}: the index at {root} has no sdist of that version")
        with urllib.request.urlopen(entry["url"], timeout=INDEX_TIMEOUT_S, context=context) as response:
            data = response.read()
    except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        raise SourceError(f"{spec}: cannot fetch the sdist from {url}: {exc}") from exc
    expected = entry.get("hashes", {}).get("sha256")
    if expected and hashlib.sha256(data).hexdigest() != expected:
        raise SourceError(f"{entry['filename']}: its sha256 differs from the index's")
    unpacked = dest.with_name(dest.name + ".unpack")
    shutil.rmtree(unpacked, ignore_errors=True)
    unpacked.mkdir(parents=True)
    archive = unpacked / entry["filename"]
    archive.write_bytes(data)
    try:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as z:
                for member in z.namelist():
                    if member.startswith("/") or ".." in Path(member).parts:
                        raise SourceError(f"{archive.name}: unsafe member {member!r}")
                z.extractall(unpacked)
        else:
            with tarfile.open(archive) as tar:
                tar.extractall(unpacked, filter="data")
    except (tarfile.TarError, zipfile.BadZipFile, OSError) as exc:
        raise SourceError(f"{archive.name}: cannot unpack: {exc}") from exc
    archive.unlink()
    tops = [p for p in unpacked.iterdir() if p.is_dir()]
    if len(tops) != 1:
        raise SourceError(f"{entry['filename']}: expected one top folder, found {len(tops)}")
    tops[0].rename(dest)
    shutil.rmtree(unpacked, ignore_errors=True)
