"""The environment's installer in the Docker sandbox, for real: uv's pip interface (the sandbox
image's pinned uv) by default, pip when chosen, pip when the image has no uv, and pip again when
uv fails where pip may not; uv's conflict said as a conflict; the host's index settings in uv's
variables. Each set-up line names the installer that ran."""

from __future__ import annotations

import dataclasses
import os
import platform
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from clover_agent.cli.doctor import check_docker
from clover_agent.environments.python_deps import EnvironmentOptions, discover
from clover_agent.environments.recipe import CA_PATH
from clover_agent.sandboxes.base import SandboxSpec
from clover_agent.sandboxes.docker import docker_client
from clover_agent.sandboxes.env_image import LABEL_ENV_REPO, environment_images, remove_images
from clover_agent.sandboxes.errors import SandboxSetupError
from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.sandboxes.images import (
    DEFAULT_BASE_IMAGE,
    LABEL_UV,
    UV_VERSION,
    build_sandbox_image,
    image_exists,
    uv_binary,
)
from clover_agent.settings import Settings, host_package_index
from tests.git_repos import make_repo
from tests.real_projects import drop_image, environment_image, fetch_sdist
from tests.sandboxes.test_environment_docker import (
    IMAGE,
    own_leftovers,
    remove_environment_images,  # noqa: F401 (the autouse fixture: this module's images removed)
)

pytestmark = [pytest.mark.docker, pytest.mark.index, pytest.mark.slow]

#: What a distribution's INSTALLER file says, in the sandbox's environment.
INSTALLER_OF = "python -c \"import importlib.metadata as m, sys; print(m.distribution(sys.argv[1]).read_text('INSTALLER'))\""


#: The environment's pip and setuptools versions.
SEEDED = "python -m pip --version | cut -d' ' -f1-2 && python -c 'import setuptools; print(setuptools.__version__)'"


def small_project(root: Path, *, dependency: str = "text-unidecode==1.3") -> Path:
    """A project with one runtime dependency and one test dependency (its ``test`` extra), both
    imported by its test; a new description each time, so its environment is made here."""
    return make_repo(
        root,
        {
            "pyproject.toml": '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n'
            f'[project]\nname = "demo-uv"\nversion = "0.3"\ndescription = "{uuid.uuid4().hex}"\n'
            f'dependencies = ["{dependency}"]\n[project.optional-dependencies]\ntest = ["six==1.17.0"]\n',
            "src/demo_uv/__init__.py": "from text_unidecode import unidecode\n",
            "tests/test_demo.py": "import six, demo_uv\n\n"
            "def test_both():\n    assert demo_uv.unidecode('é') == 'e' and six.PY3\n",
            ".gitignore": "*.egg-info/\n",
        },
    )


def spec_for(repo: Path, messages: list[str], image: str = IMAGE, **options: object) -> SandboxSpec:
    options.setdefault("index", host_package_index(os.environ))
    recipe = discover(repo, EnvironmentOptions(**options))  # type: ignore[arg-type]
    return SandboxSpec(repo=str(repo), image=image, environment=recipe, progress=messages.append)


async def test_uv_sets_the_project_up_and_pip_does_when_chosen_each_line_naming_it(tmp_path: Path) -> None:
    said: list[str] = []
    async with create_sandbox("docker", spec_for(small_project(tmp_path / "uv"), said)) as sb:
        tests = await sb.exec("python -m pytest -q -p no:cacheprovider")
        assert tests.exit_code == 0 and "1 passed" in tests.output, tests.output
        assert (await sb.exec(f"{INSTALLER_OF} six")).output.strip() == "uv"
        assert (await sb.exec(f"{INSTALLER_OF} demo-uv")).output.strip() == "uv"
        # the environment made by uv, seeded with the pip and setuptools python3 -m venv would give
        made = await sb.exec(f"grep -c '^uv = {UV_VERSION}$' /opt/clover/venv/pyvenv.cfg")
        assert made.output.strip() == "1", made.output
        seeded = await sb.exec(SEEDED)
        assert seeded.exit_code == 0, seeded.output
        # compiled at install as pip does (Python writes no bytecode in the read-only sandbox)
        compiled = await sb.exec(
            "ls /opt/clover/venv/lib/python3*/site-packages/six*.pyc "
            "/opt/clover/venv/lib/python3*/site-packages/__pycache__/six*.pyc 2>/dev/null"
        )
        assert compiled.output.strip(), "six was installed without its bytecode"
    named = [m for m in said if m.startswith("environment: installer ")]
    assert named and named[0].startswith(f"environment: installer uv {UV_VERSION} ("), said
    assert named[0].endswith("(pip is the fallback)"), said
    assert any(
        m.startswith("environment: uv pip install the project (editable, extras test)") for m in said
    ), said
    assert not any("fallback, tries it" in m for m in said), said

    chose: list[str] = []
    repo = small_project(tmp_path / "pip")
    async with create_sandbox("docker", spec_for(repo, chose, installer="pip")) as sb:
        tests = await sb.exec("python -m pytest -q -p no:cacheprovider")
        assert tests.exit_code == 0 and "1 passed" in tests.output, tests.output
        assert (await sb.exec(f"{INSTALLER_OF} six")).output.strip() == "pip"
        assert (await sb.exec(SEEDED)).output == seeded.output  # the same pip and setuptools
        assert (await sb.exec("grep -c '^uv = ' /opt/clover/venv/pyvenv.cfg")).output.strip() == "0"
    assert "environment: installer pip (chosen in .clover/config.toml's [sandbox] installer)" in chose, chose
    assert any(m.startswith("environment: pip install the project (editable, extras test)") for m in chose)
    assert own_leftovers() == []


async def test_a_conflict_uv_finds_is_said_as_a_conflict_with_uvs_lines_and_no_pip_retry(
    tmp_path: Path,
) -> None:
    """The project needs text-unidecode 1.3 and the set-up asks for 1.2 as well: uv says "No
    solution found" and why; the message puts those lines first and says it is a conflict; pip
    would find the same conflict, so it is not run."""
    said: list[str] = []
    repo = small_project(tmp_path / "demo")
    with pytest.raises(SandboxSetupError) as caught:
        await create_sandbox("docker", spec_for(repo, said, packages=("text-unidecode==1.2",))).start()
    message = caught.value.message
    assert "$ uv pip install --python /opt/clover/venv/bin/python -e '.[test]'" in message, message
    decided = message.split("what decided it:\n", 1)[1].split("\n[...]\n", 1)[0]
    lines = decided.splitlines()
    assert lines[0] == "error: No solution found when resolving dependencies", decided
    assert any(
        line.startswith(("cause: Because", "╰─▶ Because")) and "text-unidecode" in line for line in lines
    )
    assert (
        "The requirements conflict: no set of versions satisfies them all (the conflict uv names" in message
    )
    assert not any("fallback, tries it" in m for m in said), said
    assert own_leftovers() == []


async def test_uv_failing_where_pip_does_not_falls_back_to_pip_and_says_so(tmp_path: Path) -> None:
    """markupsafe 2.1.4 (its release, made a repository): without a compiler its setup.py builds
    again without its C speedups. Under pip the editable install then succeeds; under uv 0.13.9
    (setuptools' editable build in uv's build folder) the second build fails ("Cannot update time
    stamp of directory"), so pip, the fallback, runs the step, and the environment works with no
    compiler variant."""
    said: list[str] = []
    repo = fetch_sdist("MarkupSafe", "2.1.4", tmp_path / "src")
    drop_image(environment_image(repo))  # made by an earlier run (or bench/eval_setup_times.py)
    async with create_sandbox("docker", spec_for(repo, said)) as sb:
        escaped = await sb.exec("python -c 'import markupsafe; print(markupsafe.escape(\"<a>\"))'")
        assert escaped.output.strip() == "&lt;a&gt;", escaped.output
        assert (await sb.exec(f"{INSTALLER_OF} pytest")).output.strip() == "pip"  # the same step's
        assert "clover-agent-compiler" not in sb.image
    fell_back = [m for m in said if m.startswith("environment: uv failed at this step (")]
    assert fell_back and fell_back[0].endswith("pip, the fallback, tries it"), said
    uv_step = next(i for i, m in enumerate(said) if m.startswith("environment: uv pip install the project"))
    pip_step = next(i for i, m in enumerate(said) if m.startswith("environment: pip install the project"))
    assert uv_step < pip_step, said
    assert not any("compiler variant" in m for m in said), said
    assert own_leftovers() == []


async def test_an_image_without_uv_sets_up_with_pip_and_says_why(tmp_path: Path) -> None:
    """A sandbox image built without uv (as `sandbox build` makes one when uv cannot be fetched, or
    an image of an older clover-agent): pip installs, and the set-up says so."""
    client = docker_client(Settings.load().docker_env)
    tag = f"clover-agent-sandbox:test-no-uv-{os.getpid()}"
    try:
        if not image_exists(client, DEFAULT_BASE_IMAGE):
            pytest.fail(
                f"the base image {DEFAULT_BASE_IMAGE} is needed (sandboxes/images/make-base-image.sh)"
            )
        build_sandbox_image(client, base=DEFAULT_BASE_IMAGE, tag=tag, progress=lambda _line: None, uv=None)
        assert client.api.inspect_image(tag)["Config"]["Labels"][LABEL_UV] == "none"
        # doctor says it of the image
        image_check = check_docker(tag, Settings.load().docker_env)[-1]
        assert image_check.ok and "no uv: environments are set up with pip" in image_check.detail
        said: list[str] = []
        async with create_sandbox(
            "docker", spec_for(small_project(tmp_path / "demo"), said, image=tag)
        ) as sb:
            tests = await sb.exec("python -m pytest -q -p no:cacheprovider")
            assert tests.exit_code == 0 and "1 passed" in tests.output, tests.output
            assert (await sb.exec(f"{INSTALLER_OF} six")).output.strip() == "pip"
        assert any(m.startswith("environment: installer pip: the sandbox image has no uv") for m in said), (
            said
        )
        assert any(m.startswith("environment: pip install the project (editable, extras test)") for m in said)
    finally:
        mine = [
            i
            for i in environment_images(client)
            if i["Labels"].get(LABEL_ENV_REPO, "").startswith(str(tmp_path))
        ]
        remove_images(client, mine)
        client.api.remove_image(tag, force=False)
        client.close()


async def test_the_hosts_extra_index_and_trusted_host_reach_uv_in_the_set_up(tmp_path: Path) -> None:
    """The host's pip configuration with an extra index and a trusted host (the same index again,
    so the install still resolves): uv's variables in the set-up carry them, with the CA bundle,
    and the install through them works."""
    host = host_package_index(os.environ)
    index = dataclasses.replace(
        host,
        extra_index_urls=("https://pypi.org/simple",),
        trusted_hosts=("pypi.org", "files.pythonhosted.org"),
    )
    said: list[str] = []
    record = "env | grep -E '^(UV_|SSL_CERT_FILE=)' | sort > /workspace/uv-env.txt"
    spec = spec_for(small_project(tmp_path / "demo"), said, index=index, setup=(record,))
    async with create_sandbox("docker", spec) as sb:
        seen = (await sb.read_file("/workspace/uv-env.txt")).decode().splitlines()
        assert (await sb.exec("python -m pytest -q -p no:cacheprovider")).exit_code == 0
    assert "UV_EXTRA_INDEX_URL=https://pypi.org/simple" in seen, seen
    assert "UV_INDEX_STRATEGY=unsafe-best-match" in seen, seen
    assert "UV_INSECURE_HOST=pypi.org files.pythonhosted.org" in seen, seen
    assert "UV_NO_CONFIG=1" in seen and "UV_NO_CACHE=1" in seen, seen
    if host.ca_bundle:
        assert f"SSL_CERT_FILE={CA_PATH}" in seen, seen
    if host.index_url:
        assert f"UV_DEFAULT_INDEX={host.index_url}" in seen, seen
    assert any(m.startswith(f"environment: installer uv {UV_VERSION}") for m in said), said


@pytest.mark.skipif(
    platform.machine() != "x86_64" or sys.platform != "linux", reason="runs the x86_64 binary here"
)
def test_sandbox_builds_uv_is_the_pinned_wheels_binary_fetched_once(tmp_path: Path) -> None:
    """What `sandbox build` puts in the image: uv's binary from its pinned manylinux wheel on the
    package index (this machine's pip and its configuration fetch it), kept for the next build."""
    binary, why = uv_binary(tmp_path / "cache", "x86_64")
    assert binary is not None, why
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    assert version.stdout.startswith(f"uv {UV_VERSION} "), version.stdout + version.stderr
    kept = binary.stat().st_mtime_ns
    again, _ = uv_binary(tmp_path / "cache", "x86_64", python="/nonexistent/python")  # no download now
    assert again == binary and binary.stat().st_mtime_ns == kept
    none, why = uv_binary(tmp_path / "other", "s390x")
    assert none is None and "no uv wheel is known for the architecture s390x" in why
    failed, why = uv_binary(tmp_path / "other", "x86_64", python="/nonexistent/python")
    assert failed is None and f"`pip download uv=={UV_VERSION}` did not run" in why
