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
from dataclasses import dataclass
from pathlib import Path

from clover_agent.launch import sandbox_spec
from clover_agent.sandboxes.docker import docker_client
from clover_agent.sandboxes.env_image import environment_tag, remove_images
from clover_agent.settings import Settings, host_package_index
from tests.git_repos import git

INDEX_TIMEOUT_S = 120


@dataclass(frozen=True)
class Project:
    """A pinned project, the bug a test injects (``buggy`` replaces ``good`` in ``path``), and the
    target that then fails."""

    name: str
    version: str
    why: str  # what it exercises in the environment
    path: str
    good: str
    buggy: str
    target: str  # what the user asks ``fix`` for
    check: str  # the run_tests target the replayed agent checks its fix with
    says: tuple[str, ...] = ()  # what the first run's set-up must say it found


PROJECTS = (
    Project(
        "pluggy", "1.5.0", "setuptools-scm with no tag in the repository (the version from PKG-INFO, "
        "which pytest's pluggy>=1.5 needs), tox.ini's pytest section, needs itself installed",
        "src/pluggy/_manager.py", "        return self.get_plugin(name) is not None\n",
        "        return self.get_plugin(name) is None\n",
        "testing/test_pluginmanager.py::test_has_plugin", "testing/test_pluginmanager.py",
        says=("its version 1.5.0, from PKG-INFO",),
    ),
    Project(
        "marshmallow", "3.23.3", "a runtime dependency (packaging, which Debian's site-packages also has) "
        "and a src layout",
        "src/marshmallow/utils.py", 'return isinstance(obj, tuple) and hasattr(obj, "_fields")',
        'return isinstance(obj, tuple) or hasattr(obj, "_fields")',
        "tests/test_utils.py::test_is_keyed_tuple", "tests/test_utils.py",
    ),
    Project(
        "humanize", "4.11.0", "pytest plugins in its test extras (freezegun, pytest-cov), a src layout and "
        "a version file hatch-vcs writes at install time",
        "src/humanize/number.py", "    if value % 100 in (11, 12, 13):  # special case\n",
        "    if value % 100 in (11, 12):  # special case\n",
        "the ordinal of 13 is wrong", "-k ordinal",
    ),
)  # fmt: skip


def inject(repo: Path, project: Project) -> None:
    """Commit the project's bug in ``repo`` (as a bug lands in a project's history); when it is
    committed already, put the buggy file back."""
    path = repo / project.path
    text = path.read_text()
    if project.buggy in text and project.good not in text:
        return
    if git(repo, "log", "-1", "--format=%s").startswith("a bug"):
        git(repo, "checkout", "-q", "--", project.path)
        return
    assert text.count(project.good) == 1, f"{project.path}: the code to break is not there once"
    path.write_text(text.replace(project.good, project.buggy))
    git(repo, "commit", "-q", "-am", f"a bug in {project.path}")


def replay_file(path: Path, project: Project) -> Path:
    """A replay (JSON Lines of raw assistant turns) that repairs the injected bug: look at the
    file, replace the line, run the target, finish."""
    file = f"/workspace/{project.path}"

    def call(name: str, **args: str) -> str:
        params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
        return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"

    turns = [
        call("editor", command="view", path=file),
        "The condition is wrong; restore it.\n\n"
        + call(
            "editor",
            command="str_replace",
            path=file,
            old_str=project.buggy.rstrip("\n"),
            new_str=project.good.rstrip("\n"),
        ),
        call("run_tests", target=project.check),
        call("finish", summary=f"Restored the broken line in {project.path}."),
    ]
    path.write_text("".join(json.dumps({"content": t}) + "\n" for t in turns))
    return path


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


def environment_image(repo: Path) -> str:
    """The tag of the environment image a Docker sandbox over ``repo`` starts from."""
    settings = Settings.load()
    spec = sandbox_spec(settings, repo, environment=True)
    assert spec.environment is not None and spec.image is not None
    client = docker_client(settings.docker_env)
    try:
        return environment_tag(spec.environment, client.api.inspect_image(spec.image)["Id"])
    finally:
        client.close()


def drop_image(tag: str) -> None:
    """Remove the environment image ``tag`` (made by an earlier run), when it exists."""
    client = docker_client(Settings.load().docker_env)
    try:
        remove_images(client, [{"Id": tag}])
    finally:
        client.close()
