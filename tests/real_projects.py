"""Real third-party projects for end-to-end tests: a pinned sdist fetched from the package index
this machine's pip uses (with pip's CA bundle), its sha256 checked against the index's, unpacked
and committed as a git repository, as a user's checkout would be."""

from __future__ import annotations

import hashlib
import json
import os
import re
import ssl
import tarfile
import urllib.request
from pathlib import Path

from clover_agent.settings import host_package_index
from tests.git_repos import git

INDEX_TIMEOUT_S = 120


def _context() -> tuple[str, ssl.SSLContext]:
    index = host_package_index(os.environ)
    pem = index.ca_bundle.decode("ascii", "replace") if index.ca_bundle else None
    return (index.index_url or "https://pypi.org/simple/").rstrip("/"), ssl.create_default_context(cadata=pem)


def fetch_sdist(name: str, version: str, dest: Path) -> Path:
    """``name==version``'s sdist, unpacked into ``dest`` (its top folder, returned), a git
    repository with the sdist's files in one commit on ``main``."""
    root, context = _context()
    normalized = re.sub(r"[-_.]+", "-", name).lower()
    request = urllib.request.Request(
        f"{root}/{normalized}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=INDEX_TIMEOUT_S, context=context) as response:
        files = json.load(response)["files"]
    wanted = {f"{name}-{version}.tar.gz", f"{normalized.replace('-', '_')}-{version}.tar.gz"}
    entry = next(f for f in files if f["filename"] in wanted)
    with urllib.request.urlopen(entry["url"], timeout=INDEX_TIMEOUT_S, context=context) as response:
        data = response.read()
    if hashlib.sha256(data).hexdigest() != entry["hashes"]["sha256"]:
        raise AssertionError(f"{entry['filename']}: sha256 differs from the index's")
    archive = dest / entry["filename"]
    dest.mkdir(parents=True, exist_ok=True)
    archive.write_bytes(data)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    archive.unlink()
    (top,) = [p for p in dest.iterdir() if p.is_dir()]
    git(top, "init", "-q", "-b", "main")
    git(top, "add", "-A")
    git(top, "commit", "-q", "-m", f"{name} {version} as released")
    return top
