"""A SWE-bench instance made on this machine, in the shape swebench's images have, with no registry
and no internet: ``psf/requests`` at version ``2.31`` (swebench's spec for it: ``pytest -rA``,
``python -m pip install .``, the ``pytest`` package; the one spec whose test spec swebench makes
without fetching a requirements file from GitHub).

The repository is requests 2.31.0's sdist from the package index, committed with one planted bug
(``get_auth_from_url`` no longer unquotes); the test patch adds a test of it, the gold patch is
the code as released. The instance image is built FROM the local base image: ``/testbed`` holds
the repository at its base commit, ``/opt/miniconda3/envs/testbed`` a virtual environment with
pytest and requests' dependencies (wheels fetched on the host with its pip, so the build needs no
network; this machine's Python 3.11 where the spec says 3.9) and the project installed as the spec
says, and ``/opt/miniconda3/bin/activate`` gives the ``conda activate testbed`` swebench's eval
scripts start with (there is no conda here). It is tagged with swebench's own base, env and
instance names, so swebench's ``run_evaluation`` finds it and builds nothing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

REPO, VERSION, SDIST = "psf/requests", "2.31", "requests==2.31.0"
INSTANCE_ID = "psf__requests-90001"
BASE_IMAGE = "clover-agent-base:bookworm"
#: The environment: the spec's packages, requests' dependencies, and what ``pip install .`` builds with.
PACKAGES = ["pytest", "charset_normalizer<4", "idna<4", "urllib3<3", "certifi", "setuptools", "wheel"]
CODE = "requests/utils.py"
TESTS = "tests/test_utils.py"
RIGHT = "        auth = (unquote(parsed.username), unquote(parsed.password))\n"
PLANTED = "        auth = (parsed.username, parsed.password)\n"
NEW_TEST = """

def test_get_auth_from_url_unquotes_both_parts():
    assert get_auth_from_url("http://us%40er:p%40ss@example.com/") == ("us@er", "p@ss")
"""
FAIL_TO_PASS = [f"{TESTS}::test_get_auth_from_url_unquotes_both_parts"]
PASS_TO_PASS = [
    f"{TESTS}::TestSuperLen::test_string",
    f"{TESTS}::TestToKeyValList::test_invalid",
    f"{TESTS}::TestAddressInNetwork::test_valid",
    f"{TESTS}::test_set_environ_raises_exception",
]
ACTIVATE = """\
# conda's activate as far as swebench's eval scripts use it (`conda activate testbed`): this image
# has no conda, its environments are virtual environments where conda keeps its own.
conda() {
    if [ "${1:-}" = activate ] && [ -f "/opt/miniconda3/envs/${2:-}/bin/activate" ]; then
        . "/opt/miniconda3/envs/$2/bin/activate"
    else
        echo "conda $*: not in this image" >&2
        return 1
    fi
}
"""


def _git(repo: Path, *args: str, text_in: str | None = None) -> str:
    env = {
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@localhost",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@localhost",
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(
        ["git", "-C", str(repo), *args], input=text_in, capture_output=True, text=True, check=True, env=env
    ).stdout


def _pip_download(dest: Path, *args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "-d", str(dest), *args],
        check=True,
        capture_output=True,
        timeout=600,
    )


def make_repository(dest: Path) -> dict[str, str]:
    """``dest``: requests' repository at the instance's base commit; returns the base commit, the
    test patch and the gold patch."""
    sdists = dest.parent / "sdist"
    _pip_download(sdists, "--no-deps", "--no-binary", ":all:", SDIST)
    with tarfile.open(next(sdists.glob("requests-*.tar.gz"))) as archive:
        archive.extractall(sdists, filter="data")
    shutil.copytree(next(p for p in sdists.iterdir() if p.is_dir()), dest)
    code = dest / CODE
    released = code.read_text()
    assert RIGHT in released
    code.write_text(released.replace(RIGHT, PLANTED))
    _git(dest, "init", "-q", "-b", "main")
    _git(dest, "add", "-A")
    _git(dest, "commit", "-q", "-m", "requests 2.31.0, get_auth_from_url not unquoting")
    base_commit = _git(dest, "rev-parse", "HEAD").strip()
    tests = dest / TESTS
    tests.write_text(tests.read_text() + NEW_TEST)
    test_patch = _git(dest, "diff")
    _git(dest, "checkout", "-q", "--", TESTS)
    code.write_text(released)
    gold = _git(dest, "diff")
    _git(dest, "checkout", "-q", "--", CODE)
    return {"base_commit": base_commit, "test_patch": test_patch, "patch": gold}


def instance_line(made: dict[str, str]) -> dict[str, Any]:
    """The instance as a SWE-bench dataset line (the published field types: JSON-text lists)."""
    return {
        "repo": REPO,
        "instance_id": INSTANCE_ID,
        "base_commit": made["base_commit"],
        "patch": made["patch"],
        "test_patch": made["test_patch"],
        "problem_statement": "get_auth_from_url returns the user name and password still percent-encoded.",
        "hints_text": "",
        "created_at": "2026-12-06T00:00:00Z",
        "version": VERSION,
        "FAIL_TO_PASS": json.dumps(FAIL_TO_PASS),
        "PASS_TO_PASS": json.dumps(PASS_TO_PASS),
        "environment_setup_commit": made["base_commit"],
    }


def build_instance_image(client: Any, repository: Path, line: dict[str, Any], context: Path) -> str:
    """The instance image of ``line`` built FROM the local base image (``repository`` at
    ``/testbed``), tagged with swebench's base, env and instance names; returns the instance name."""
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS
    from swebench.harness.test_spec.test_spec import make_test_spec

    spec = make_test_spec(line)
    specs = MAP_REPO_VERSION_TO_SPECS[REPO][VERSION]

    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    _pip_download(
        context / "wheels", "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
        "--platform", "manylinux2014_x86_64", *PACKAGES,
    )  # fmt: skip
    shutil.copytree(repository, context / "testbed", symlinks=True)
    (context / "activate").write_text(ACTIVATE)
    offline = "PIP_NO_INDEX=1 PIP_FIND_LINKS=/opt/wheels PIP_NO_BUILD_ISOLATION=0"
    (context / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\n"
        "COPY wheels /opt/wheels\n"
        f"ENV {offline}\n"
        "RUN python3 -m venv /opt/miniconda3/envs/testbed && "
        f"/opt/miniconda3/envs/testbed/bin/pip install --quiet {' '.join(repr(p) for p in PACKAGES)}\n"
        "COPY activate /opt/miniconda3/bin/activate\n"
        "COPY testbed /testbed\n"
        f"RUN cd /testbed && . /opt/miniconda3/bin/activate && conda activate testbed && {specs['install']}\n"
        "WORKDIR /testbed\n"
    )
    image, _ = client.images.build(path=str(context), tag=spec.instance_image_key, rm=True, forcerm=True)
    for name in (spec.env_image_key, spec.base_image_key):
        repository_name, tag = name.rsplit(":", 1)
        image.tag(repository_name, tag)
    return str(spec.instance_image_key)


def remove_images(client: Any, line: dict[str, Any]) -> None:
    from swebench.harness.test_spec.test_spec import make_test_spec

    spec = make_test_spec(line)
    for name in (spec.instance_image_key, spec.env_image_key, spec.base_image_key):
        try:
            client.images.remove(name, force=True)
        except Exception:  # already gone
            pass
