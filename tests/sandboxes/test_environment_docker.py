"""Project environments in the Docker sandbox, for real: set up from the package index with this
machine's pip configuration, cached as an image, started from the cache, and failing clearly.

The projects here are tiny and local (their own code plus one small dependency from the index);
tests/clover_agent/fix/test_real_projects.py runs ``fix`` over real third-party projects.
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from clover_agent.environments.python_deps import EnvironmentOptions, discover
from clover_agent.launch import sandbox_spec as launch_spec
from clover_agent.sandboxes.base import SandboxSpec
from clover_agent.sandboxes.docker import LABEL, LABEL_OWNER_PID, docker_client
from clover_agent.sandboxes.env_image import (
    LABEL_ENV,
    LABEL_ENV_BASE,
    LABEL_ENV_REPO,
    environment_images,
    environment_tag,
    remove_images,
    superseded_environment_images,
)
from clover_agent.sandboxes.errors import SandboxSetupError
from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.sandboxes.images import COMPILER_REPOSITORY, compiler_image, compiler_images
from clover_agent.settings import DEFAULT_SANDBOX_IMAGE, Settings, host_package_index
from clover_agent.tools.run_tests import run_tests_in
from tests.cli_process import run_cli
from tests.git_repos import git, make_repo
from tests.real_projects import drop_image, environment_image, fetch_sdist

pytestmark = [pytest.mark.docker, pytest.mark.index, pytest.mark.slow]

IMAGE = os.environ.get("CLOVER_SANDBOX_IMAGE", DEFAULT_SANDBOX_IMAGE)


def spec_for(repo: Path, messages: list[str] | None = None, **options: object) -> SandboxSpec:
    recipe = discover(repo, EnvironmentOptions(index=host_package_index(os.environ), **options))  # type: ignore[arg-type]
    return SandboxSpec(
        repo=str(repo),
        image=IMAGE,
        environment=recipe,
        progress=None if messages is None else messages.append,
    )


@pytest.fixture(autouse=True)
def remove_environment_images(tmp_path: Path) -> Iterator[None]:
    """Remove the environment images made for this test's repositories afterwards."""
    yield
    client = docker_client(Settings.load().docker_env)
    try:
        mine = [
            i
            for i in environment_images(client)
            if i["Labels"].get(LABEL_ENV_REPO, "").startswith(str(tmp_path))
        ]
        remove_images(client, mine)
    finally:
        client.close()


def project(root: Path, *, dependency: str = "text-unidecode==1.3", extra: str = "") -> Path:
    """A src-layout project that needs itself installed (its version from its metadata) and one
    runtime dependency from the index; its test imports both. Its description is new each time,
    so its environment is made here, not found in the cache of an earlier run."""
    extra += f'description = "{uuid.uuid4().hex}"\n'
    return make_repo(
        root,
        {
            "pyproject.toml": '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n'
            f'[project]\nname = "demo-env"\nversion = "1.2.3"\ndependencies = ["{dependency}"]\n{extra}',
            "src/demo_env/__init__.py": 'import importlib.metadata\n__version__ = importlib.metadata.version("demo-env")\n',
            "tests/test_demo.py": "import demo_env, text_unidecode\n\n"
            "def test_version():\n    assert demo_env.__version__ == '1.2.3'\n\n"
            "def test_dependency():\n    assert text_unidecode.unidecode('é') == 'e'\n",
            ".gitignore": "*.egg-info/\n",
        },
    )


def own_leftovers() -> list[dict]:
    """Containers of this test process still on the engine."""
    client = docker_client(Settings.load().docker_env)
    try:
        found = client.api.containers(all=True, filters={"label": f"{LABEL}=1"})
        return [c for c in found if (c.get("Labels") or {}).get(LABEL_OWNER_PID) == str(os.getpid())]
    finally:
        client.close()


async def test_environment_is_isolated_set_up_once_and_reused(tmp_path: Path) -> None:
    repo = project(tmp_path / "demo")
    messages: list[str] = []
    async with create_sandbox("docker", spec_for(repo, messages)) as sb:
        image = sb.image
        where = await sb.exec("command -v python pip pytest && echo $VIRTUAL_ENV")
        assert where.output.split() == [
            "/opt/clover/venv/bin/python",
            "/opt/clover/venv/bin/pip",
            "/opt/clover/venv/bin/pytest",
            "/opt/clover/venv",
        ]
        # no system site-packages: Debian's attr and more_itertools (in the image) are not seen
        shadow = await sb.exec("python -c 'import attr' 2>&1; python -c 'import more_itertools' 2>&1")
        assert shadow.output.count("ModuleNotFoundError") == 2, shadow.output
        tests = await sb.exec("python -m pytest -q -p no:cacheprovider")
        assert tests.exit_code == 0 and "2 passed" in tests.output, tests.output
        # what the set-up made in the workspace (egg-info, ignored) is there; the diff is clean
        assert (await sb.exec("ls src/demo_env.egg-info/PKG-INFO")).exit_code == 0
        assert await sb.diff() == ""
        # the agent's commands have no network, even though the set-up had it
        offline = await sb.exec("python -m pip download --no-deps -d /tmp/x six 2>&1 | tail -1", timeout=120)
        assert "six" not in (await sb.exec("ls /tmp/x 2>/dev/null")).output, offline.output
    assert any("setting the project up" in m for m in messages)
    assert any("pip install the project (editable)" in m for m in messages)

    again: list[str] = []
    (repo / "README.md").write_text("not a dependency file\n")
    async with create_sandbox("docker", spec_for(repo, again)) as sb:
        assert sb.image == image
        assert any("cached" in m for m in again) and not any("setting the project up" in m for m in again)
        assert (await sb.exec("python -m pytest -q -p no:cacheprovider")).exit_code == 0
    assert own_leftovers() == []


@pytest.mark.xdist_group("sandbox-prune")  # another `sandbox prune` would remove `first` early
async def test_changed_dependency_files_make_a_new_environment_and_prune_removes_the_old(
    tmp_path: Path,
) -> None:
    repo = project(tmp_path / "demo")
    async with create_sandbox("docker", spec_for(repo)) as sb:
        first = sb.image
    # a new version, and a test extra with pytest-xdist: the regression runs can go in parallel
    pyproject = (repo / "pyproject.toml").read_text().replace("1.2.3", "1.2.4")
    (repo / "pyproject.toml").write_text(
        pyproject + '[project.optional-dependencies]\ntest = ["pytest-xdist"]\n'
    )
    (repo / "tests" / "test_demo.py").write_text(
        (repo / "tests" / "test_demo.py").read_text().replace("'1.2.3'", "'1.2.4'")
    )
    async with create_sandbox("docker", spec_for(repo)) as sb:
        second = sb.image
        version = await sb.exec("python -c 'import importlib.metadata as m; print(m.version(\"demo-env\"))'")
        assert version.output.strip() == "1.2.4"
        parallel = await run_tests_in(sb, None, workers=2)
        assert parallel.passed == 2 and "2 workers" in parallel.output, parallel.summary()
        serial = await run_tests_in(sb, None)
        assert serial.passed == 2 and "workers" not in serial.output
    assert first != second
    client = docker_client(Settings.load().docker_env)
    try:
        ours = {
            i["RepoTags"][0]
            for i in environment_images(client)
            if i["Labels"].get(LABEL_ENV_REPO) == str(repo)
        }
        assert {first, second} <= ours
        superseded = {t for i in superseded_environment_images(client) for t in i.get("RepoTags") or []}
        assert first in superseded and second not in superseded
    finally:
        client.close()
    prune = run_cli("sandbox", "prune", timeout=300)
    assert prune.returncode == 0, prune.stderr
    assert "environment image" in prune.stdout
    client = docker_client(Settings.load().docker_env)
    try:
        left = {t for i in environment_images(client) for t in i.get("RepoTags") or []}
    finally:
        client.close()
    assert first not in left and second in left


async def test_conflicting_requirements_are_said_as_a_conflict_with_the_lines_that_decide_it(
    tmp_path: Path,
) -> None:
    """The project pins text-unidecode 1.3 and the repository's set-up asks for 1.2: pip's resolver
    (pip chosen; uv's wording is tests/sandboxes/test_env_installer.py's) cannot satisfy both; the
    message says it is a conflict and shows pip's conflict lines first."""
    repo = project(tmp_path / "demo")
    with pytest.raises(SandboxSetupError) as caught:
        await create_sandbox(
            "docker", spec_for(repo, packages=("text-unidecode==1.2",), installer="pip")
        ).start()
    message = caught.value.message
    decided = message.split("what decided it:\n", 1)[1].split("\n\n", 1)[0]
    assert "The conflict is caused by" in decided and "text-unidecode==1.2" in decided, message
    assert "The requirements conflict: no set of versions satisfies them all" in message
    assert "Fix the project's dependency files" not in message  # the general advice is not given
    assert own_leftovers() == []


async def test_a_resolver_that_backtracked_names_what_it_walked_back_and_the_conflict(tmp_path: Path) -> None:
    """pytest>=8 with pluggy 0.12, pip chosen: pip walks back through pytest's 8.x releases (each
    needs a newer pluggy) before it gives up; the message names the package walked back and the pin
    in conflict."""
    repo = project(tmp_path / "demo")
    with pytest.raises(SandboxSetupError) as caught:
        await create_sandbox(
            "docker", spec_for(repo, packages=("pluggy==0.12.0", "pytest>=8"), installer="pip")
        ).start()
    message = caught.value.message
    decided = message.split("what decided it:\n", 1)[1].split("\n[...]\n", 1)[0]  # before the tail
    assert decided.startswith("pip walked back through the releases of pytest"), message
    assert "pluggy==0.12.0" in decided and "The conflict is caused by" in decided, message
    # pip's report lists every release it tried; the message says how many, from which to which
    assert re.search(r"\d+ releases of pytest \(8\.0\.0 … [\d.]+\) depend on pluggy", decided), decided
    assert "pytest==8.0.1" not in decided and len(decided.splitlines()) <= 8, decided
    advice = message.split("The requirements conflict", 1)[1]
    assert "walked back through the releases of pytest" in advice, message
    assert "pip is looking at multiple versions of" in caught.value.log  # pip's own words, kept
    assert own_leftovers() == []


async def test_an_index_that_cannot_be_reached_is_said_as_a_network_problem(tmp_path: Path) -> None:
    """This machine's pip configuration names an index nothing answers at: pip fails to find the
    project's build requirements, and the message says the index could not be reached (not that
    the requirement does not exist), with the settings to check and the offline way."""
    repo = project(tmp_path / "demo")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    environ["PIP_INDEX_URL"] = "http://127.0.0.1:9/simple/"  # in the container: nothing listens there
    recipe = discover(repo, EnvironmentOptions(index=host_package_index(environ)))
    spec = SandboxSpec(repo=str(repo), image=IMAGE, environment=recipe)
    with pytest.raises(SandboxSetupError) as caught:
        await create_sandbox("docker", spec).start()
    message = caught.value.message
    assert "127.0.0.1" in message and "connection refused" in message.lower(), message
    assert "The package index could not be reached from the sandbox" in message, message
    assert "A requirement is not available" not in message
    assert own_leftovers() == []


async def test_a_set_up_past_its_limit_says_so_and_what_to_pin(tmp_path: Path) -> None:
    repo = project(tmp_path / "demo")
    with pytest.raises(SandboxSetupError) as caught:
        await create_sandbox("docker", spec_for(repo, setup=("sleep 300",), timeout=20.0)).start()
    message = caught.value.message
    assert "timeout" in message and "The step ran past the set-up's limit of 20 s" in message, message
    assert own_leftovers() == []


async def test_a_dependency_that_cannot_be_installed_is_named_with_pips_output(tmp_path: Path) -> None:
    repo = project(tmp_path / "demo", dependency="clover-agent-no-such-package-xyz==1.0")
    with pytest.raises(SandboxSetupError) as caught:
        await create_sandbox("docker", spec_for(repo)).start()
    message = caught.value.message
    assert "the environment set-up failed at step 1 of 1" in message
    assert "clover-agent-no-such-package-xyz" in message  # the installer's own words, shown
    assert "was not found in the package registry" in message  # uv's (pip's: "No matching distribution")
    assert "A requirement is not available on the package index" in message
    assert own_leftovers() == []
    assert (repo / "pyproject.toml").is_file() and not (repo / "src" / "demo_env.egg-info").exists()


async def test_a_failing_setup_command_is_named_and_the_overlay_keeps_the_users_files(tmp_path: Path) -> None:
    repo = project(tmp_path / "demo")
    with pytest.raises(SandboxSetupError) as caught:
        await create_sandbox("docker", spec_for(repo, setup=("echo generating; exit 3",))).start()
    assert "run echo generating; exit 3 (exit code 3)" in caught.value.message
    assert "generating" in caught.value.message
    assert own_leftovers() == []

    generate = "echo made-by-setup > generated.txt && echo made-by-setup > notes.txt"
    (repo / "notes.txt").write_text("the user's own notes\n")
    async with create_sandbox("docker", spec_for(repo, setup=(generate,))) as sb:
        assert (await sb.read_file("/workspace/generated.txt")) == b"made-by-setup\n"
        assert (await sb.read_file("/workspace/notes.txt")) == b"the user's own notes\n"


async def test_offline_set_up_from_a_wheel_folder_made_with_pip_download(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    download = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:", "--python-version", "3.11",
         "-d", str(wheels), "pytest==8.3.4", "text-unidecode==1.3", "setuptools>=64", "wheel"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert download.returncode == 0, download.stderr
    repo = project(tmp_path / "demo")
    spec = spec_for(repo, wheels=str(wheels), network=False)
    assert spec.environment is not None and spec.environment.offline
    async with create_sandbox("docker", spec) as sb:
        tests = await sb.exec("python -m pytest -q -p no:cacheprovider")
        assert tests.exit_code == 0 and "2 passed" in tests.output, tests.output
        assert "8.3.4" in (await sb.exec("python -m pytest --version 2>&1")).output
    missing = dataclasses.replace(spec, environment=discover(repo, EnvironmentOptions(
        wheels=str(wheels), network=False, packages=("six",))))  # fmt: skip
    with pytest.raises(SandboxSetupError, match="not available in the wheel folder"):
        await create_sandbox("docker", missing).start()


# --- real projects' files, as released (pinned sdists made git repositories) ------------------


async def suite(spec: SandboxSpec, command: str = "python -m pytest -q -p no:cacheprovider") -> str:
    """Set the environment up, run the project's suite in it, and return the output (exit 0 checked)."""
    async with create_sandbox("docker", spec) as sb:
        result = await sb.exec(command, timeout=600)
        assert result.exit_code == 0 and " passed" in result.output, result.output[-4000:]
        return result.output


async def test_a_setuptools_scm_sdist_made_a_repository_installs_as_its_released_version(
    tmp_path: Path,
) -> None:
    """pluggy 1.5.0 (setuptools-scm): with no tag the tool would say 0.1.dev1, which pytest's
    ``pluggy>=1.5`` cannot take; the version comes from PKG-INFO and is part of the cache key. The
    environment it makes, set up and the suite passing in it, is tests/clover_agent/fix/
    test_real_projects.py's pluggy run."""
    repo = fetch_sdist("pluggy", "1.5.0", tmp_path / "src")
    spec = spec_for(repo)
    assert spec.environment is not None
    assert spec.environment.variables == (
        ("SETUPTOOLS_SCM_PRETEND_VERSION", "1.5.0"),
        ("SETUPTOOLS_SCM_PRETEND_VERSION_FOR_PLUGGY", "1.5.0"),
    )
    # a tag made since gives the version (and another environment)
    git(repo, "tag", "v1.5.1")
    tagged = spec_for(repo)
    assert tagged.environment is not None
    assert tagged.environment.variables == (
        ("SETUPTOOLS_SCM_PRETEND_VERSION", "1.5.1"),
        ("SETUPTOOLS_SCM_PRETEND_VERSION_FOR_PLUGGY", "1.5.1"),
    )
    assert tagged.environment.cache_key("base") != spec.environment.cache_key("base")


async def test_tox_deps_of_the_plain_environment_set_a_real_project_up(tmp_path: Path) -> None:
    """python-slugify 9.2.0: its tests need tox's ``[testenv] deps``, whose ``unidecode: ...``
    lines belong to the environments with that factor; its dev.requirements.txt is not used."""
    repo = fetch_sdist("python-slugify", "9.2.0", tmp_path / "src")
    messages: list[str] = []
    output = await suite(spec_for(repo, messages))
    assert "failed" not in output and "error" not in output.lower(), output[-3000:]
    found = " | ".join(messages)
    assert "tox.ini's [testenv] deps (the plain environment: lines for unidecode, anyascii left out)" in found
    assert "dev.requirements.txt" not in found


async def test_an_old_setuptools_scm_gets_the_projects_own_version_and_its_requirements_resolve(
    tmp_path: Path,
) -> None:
    """python-dateutil 2.9.0.post0: setuptools-scm<8 through setup.py's use_scm_version, which reads
    only the plain pretend variable; freezegun, in its dev requirements, needs python-dateutil>=2.7.
    With the version right the install resolves at once (a wrong one walked pip back through every
    freezegun release), and the set-up's own check says the installed version."""
    repo = fetch_sdist("python-dateutil", "2.9.0.post0", tmp_path / "src")
    drop_image(environment_image(repo))  # an earlier run's: this one sets the project up
    messages: list[str] = []
    async with create_sandbox("docker", spec_for(repo, messages)) as sb:
        versions = await sb.exec(
            'python -c \'import importlib.metadata as m; print(m.version("python-dateutil"), m.version("freezegun"))\''
        )
    assert versions.exit_code == 0, versions.output
    assert versions.output.split()[0] == "2.9.0.post0"
    said = " | ".join(messages)
    assert "SETUPTOOLS_SCM_PRETEND_VERSION; checked after the install)" in said
    assert "check that the installed python-dateutil says version 2.9.0.post0" in said
    assert own_leftovers() == []


def _variant_environment(spec: SandboxSpec, variant: str) -> str:
    """The tag of ``spec``'s environment over the compiler ``variant``, removed when it is there
    (an earlier run's): the test makes it."""
    client = docker_client(Settings.load().docker_env)
    try:
        assert spec.environment is not None
        tag = environment_tag(spec.environment, client.api.inspect_image(variant)["Id"])
        remove_images(client, [i for i in environment_images(client) if tag in (i.get("RepoTags") or [])])
    finally:
        client.close()
    return tag


@pytest.mark.xdist_group("compiler-variant")  # one worker builds the variant, once
async def test_a_required_c_extension_takes_the_compiler_variant_by_itself(
    tmp_path: Path, compiler_variant: str
) -> None:
    """mmh3 4.1.0: its extension is required and the sandbox image has no compiler. With the
    defaults the set-up fails building it, says so, and is made once more by itself in the image's
    compiler variant, where it builds; the next start finds that environment in the cache, with no
    failed set-up first."""
    repo = fetch_sdist("mmh3", "4.1.0", tmp_path / "src")
    messages: list[str] = []
    spec = spec_for(repo, messages)
    assert not spec.compiler
    tag = _variant_environment(spec, compiler_variant)
    async with create_sandbox("docker", spec) as sb:
        built = await sb.exec("python -c 'import mmh3; print(mmh3.hash(\"clover\"))'")
        assert built.exit_code == 0, built.output
        assert sb.image == tag
    said = " | ".join(messages)
    assert "an extension could not be built without a compiler; setting up once more in the image's " in said
    assert "compiler: cached" in said
    again: list[str] = []
    async with create_sandbox("docker", spec_for(repo, again)) as sb:
        assert sb.image == tag
    said = " | ".join(again)
    assert f"environment: cached, in the compiler variant (its set-up builds an extension: {tag})" in said
    assert "setting the project up" not in said  # no failed set-up first
    assert own_leftovers() == []


@pytest.mark.xdist_group("compiler-variant")
async def test_an_extension_the_compiler_variant_cannot_build_either_says_both_were_tried(
    tmp_path: Path, compiler_variant: str
) -> None:
    """An extension that needs a library's headers the variant lacks: both set-ups fail, and the
    message says what the variant had, what to do, and that both were tried."""
    repo = make_repo(
        tmp_path / "needs-headers",
        {
            "setup.py": "from setuptools import Extension, setup\n"
            "setup(name='needs-headers', version='1.0', ext_modules=[Extension('fast', ['fast.c'])])\n",
            "fast.c": f"#include <clover_missing_{uuid.uuid4().hex[:8]}.h>\n",
            "tests/test_fast.py": "def test_it():\n    import fast\n",
        },
    )
    messages: list[str] = []
    spec = spec_for(repo, messages)
    with pytest.raises(SandboxSetupError) as caught:
        await create_sandbox("docker", spec).start()
    message = caught.value.message
    assert "setting up once more in the image's compiler variant" in " | ".join(messages)
    assert "although the sandbox had" in message and "(--with-compiler)" in message  # the variant's advice
    assert "Tried without a compiler, then by itself in the image's compiler variant" in message
    assert "Fix the project's dependency files" not in message
    assert own_leftovers() == []


@pytest.fixture(scope="session")
def compiler_variant() -> str:
    """The compiler variant of the sandbox image, as the sandbox makes it: built on this machine's
    first use and kept, as the cache it is, for the next sessions."""
    client = docker_client(Settings.load().docker_env)
    try:
        tag, _built = compiler_image(client, IMAGE, progress=lambda _line: None, host_env=os.environ)
    finally:
        client.close()
    return tag


@pytest.mark.xdist_group("compiler-variant")  # one worker builds the variant, once
async def test_a_required_c_extension_builds_in_the_compiler_variant_reused_from_the_cache(
    tmp_path: Path, compiler_variant: str
) -> None:
    """mmh3 4.1.0 again, with ``compiler = true`` in the repository's (untrusted) file: its
    extension is compiled in the set-up and its own tests pass on it; the variant the fixture made
    is the one the sandbox starts from, found in the cache, not built again."""
    repo = fetch_sdist("mmh3", "4.1.0", tmp_path / "src")
    (repo / ".clover").mkdir()
    (repo / ".clover" / "config.toml").write_text("[sandbox]\ncompiler = true\n")
    messages: list[str] = []
    spec = launch_spec(Settings.load(), repo, image=IMAGE, environment=True, progress=messages.append)
    assert spec.compiler
    async with create_sandbox("docker", spec) as sb:
        compiled = await sb.exec("python -c 'import mmh3; print(mmh3.__file__)'; gcc --version")
        assert compiled.exit_code == 0, compiled.output
        # the editable install built it in place; the environment image's overlay brought it here
        assert compiled.output.split()[0] == "/workspace/src/mmh3.cpython-311-x86_64-linux-gnu.so"
        assert "gcc (Debian" in compiled.output
        # The sdist leaves out tests/helper.py, which its test_mmh3.py imports: a one-line
        # stand-in (a 32-bit unsigned value as signed), so its known-answer tests run on the build.
        await sb.write_file(
            "/workspace/tests/helper.py",
            b"def u32_to_s32(v):\n    return v - (1 << 32) if v >= 1 << 31 else v\n",
        )
        result = await sb.exec("python -m pytest -q -p no:cacheprovider", timeout=600)
        assert result.exit_code == 0 and "28 passed" in result.output, result.output[-4000:]
        client = docker_client(Settings.load().docker_env)
        try:
            labels = client.api.inspect_image(sb.image)["Config"]["Labels"]
            variant_id = client.api.inspect_image(compiler_variant)["Id"]
        finally:
            client.close()
        assert labels[LABEL_ENV_BASE] == variant_id  # the environment was made over the variant
        environment = sb.image
    assert f"compiler: cached ({compiler_variant})" in messages, messages
    assert not any("building the compiler variant" in m for m in messages)
    assert own_leftovers() == []
    if IMAGE == DEFAULT_SANDBOX_IMAGE:  # the command builds the default image's variant: the same one
        cli = run_cli("sandbox", "build", "--quiet", "--with-compiler", timeout=600)
        assert cli.returncode == 0, cli.stderr
        assert f"already built (cached): {compiler_variant}" in cli.stdout, cli.stdout
    # what `sandbox prune` removes: a variant of another recipe (a stand-in: the real one's labels
    # under another tag) and an environment over it, not this variant nor the environment made over
    # it (which inherits the variant's labels)
    client = docker_client(Settings.load().docker_env)
    stale = f"{COMPILER_REPOSITORY}:test-{uuid.uuid4().hex[:12]}"
    over_stale = f"clover-agent-test-env-over-stale:{uuid.uuid4().hex[:12]}"

    def build(tag: str, dockerfile: str) -> str:
        for _ in client.api.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, decode=True):
            pass
        return client.api.inspect_image(tag)["Id"]

    try:
        stale_id = build(stale, f"FROM {compiler_variant}\nLABEL clover-agent.test=1\n")
        build(
            over_stale,
            f'FROM {stale}\nLABEL "{LABEL_ENV}"="1" "{LABEL_ENV_BASE}"="{stale_id}" "{LABEL_ENV_REPO}"="{tmp_path}"\n',
        )
        superseded = {t for i in compiler_images(client) for t in i["RepoTags"]}
        everything = {t for i in compiler_images(client, everything=True) for t in i["RepoTags"]}
        assert stale in superseded and compiler_variant not in superseded
        assert {stale, compiler_variant} <= everything and environment not in everything
        going = {
            t for i in superseded_environment_images(client, stale_bases={stale_id}) for t in i["RepoTags"]
        }
        assert over_stale in going and environment not in going
    finally:
        remove_images(client, [{"Id": tag} for tag in (over_stale, stale)])
        client.close()
