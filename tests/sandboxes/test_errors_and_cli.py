"""Clear messages when Docker or the image is missing, the sandbox CLI, and per-repository config."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

import docker
import pytest

from clover_agent.cli.options import add_sandbox_arguments, sandbox_spec_of
from clover_agent.environments.recipe import EnvironmentRecipe
from clover_agent.errors import ExitCode, UsageError, exit_code_for
from clover_agent.launch import sandbox_spec as launch_spec
from clover_agent.sandboxes.base import SandboxSpec
from clover_agent.sandboxes.docker import DockerSandbox
from clover_agent.sandboxes.env_image import advice
from clover_agent.sandboxes.errors import SandboxConfigError, SandboxUnavailable
from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.sandboxes.images import compiler_tag
from clover_agent.sandboxes.local import LocalSandbox
from clover_agent.settings import DEFAULT_SANDBOX_IMAGE, Settings, repo_settings
from tests.cli_process import run_cli
from tests.sandbox_specs import sandbox_spec

from .conftest import start_holder
from .test_docker_lifecycle import container_exists


async def test_docker_not_running_is_one_clear_error(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")  # read by the settings
    with pytest.raises(SandboxUnavailable) as excinfo:
        await DockerSandbox(sandbox_spec(repo)).start()
    message = excinfo.value.message
    assert (
        "no Docker engine answers at unix:///nonexistent/docker.sock (its socket does not exist)" in message
    )
    assert "--sandbox local" in message and "start" in message
    assert exit_code_for(excinfo.value) == ExitCode.SANDBOX_UNAVAILABLE
    assert "Connection aborted" not in message and "FileNotFoundError" not in message  # words, no reprs


async def test_an_engine_that_refuses_is_said_in_words(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{port}")
    with pytest.raises(SandboxUnavailable) as excinfo:
        await DockerSandbox(sandbox_spec(repo)).start()
    message = excinfo.value.message
    assert f"at tcp://127.0.0.1:{port} (connection refused: nothing listens there)" in message
    assert "Errno" not in message and "HTTPConnection" not in message


@pytest.mark.parametrize("action", ["prune", "build"])
def test_cli_reports_docker_missing_without_traceback(action: str) -> None:
    """`sandbox build|prune` need Docker itself: the fix says how to reach it, and does not offer
    `--sandbox local`, an option these commands do not take."""
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    result = run_cli("sandbox", action, env=env)
    assert result.returncode == ExitCode.SANDBOX_UNAVAILABLE
    assert "no Docker engine answers" in result.stderr and "start docker" in result.stderr
    assert "DOCKER_HOST" in result.stderr and "--sandbox local" not in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.docker
async def test_missing_image_is_one_clear_error(repo: Path) -> None:
    spec = sandbox_spec(repo, image="clover-agent-test-no-such-image:never")
    with pytest.raises(SandboxUnavailable) as excinfo:
        await DockerSandbox(spec).start()
    message = excinfo.value.message
    assert "clover-agent-test-no-such-image:never is not on this Docker engine" in message
    assert "clover-agent sandbox build" in message and "--sandbox local" in message


@pytest.mark.docker
async def test_repository_config_chooses_the_image(repo: Path) -> None:
    (repo / ".clover").mkdir()
    (repo / ".clover" / "config.toml").write_text('[sandbox]\nimage = "clover-agent-test-repo-image:x"\n')
    with pytest.raises(SandboxUnavailable, match="clover-agent-test-repo-image:x"):
        await DockerSandbox(sandbox_spec(repo)).start()
    # An explicit image in the spec (--image) wins over the repository's choice.
    trusted = repo_settings(repo, trusted=True)
    assert launch_spec(Settings.load(), repo, image="mine:1", repo_config=trusted).image == "mine:1"


def test_config_defaults_and_errors(repo: Path) -> None:
    no_file = {"CLOVER_CONFIG": str(repo / "no-user-config.toml")}
    settings = Settings.load(no_file)
    from_env = Settings.load({**no_file, "CLOVER_SANDBOX_IMAGE": "env:3"})
    assert launch_spec(settings, repo).image == DEFAULT_SANDBOX_IMAGE
    assert launch_spec(from_env, repo).image == "env:3"
    (repo / ".clover").mkdir()
    (repo / ".clover" / "config.toml").write_text('[sandbox]\nimage = "repo:2"\n')
    assert launch_spec(from_env, repo).image == "env:3"  # not trusted: the repository's choice is ignored
    trusted = repo_settings(repo, trusted=True)
    assert launch_spec(from_env, repo, repo_config=trusted).image == "repo:2"  # trusted, it wins
    (repo / ".clover" / "config.toml").write_text("[sandbox]\nsetup = 'not a list'\n")
    with pytest.raises(UsageError, match="setup must be a list"):
        launch_spec(settings, repo)
    (repo / ".clover" / "config.toml").write_text("[sandbox\n")
    with pytest.raises(UsageError, match="invalid TOML"):
        launch_spec(settings, repo)
    (repo / ".clover" / "config.toml").write_text('sandbox = "docker"\n')
    with pytest.raises(UsageError, match=r"\[sandbox\] must be a table"):
        launch_spec(settings, repo)


def test_the_compiler_variant_is_chosen_by_the_flag_or_the_repository_file(repo: Path) -> None:
    settings = Settings.load({"CLOVER_CONFIG": str(repo / "no-user-config.toml")})
    assert not launch_spec(settings, repo).compiler
    parser = argparse.ArgumentParser()
    add_sandbox_arguments(parser)
    args = parser.parse_args(["--sandbox", "docker", "--with-compiler"])
    assert sandbox_spec_of(args, settings, repo, repo_settings(repo)).compiler
    (repo / ".clover").mkdir()
    (repo / ".clover" / "config.toml").write_text("[sandbox]\ncompiler = true\n")
    # a choice between two images made from clover-agent's own recipes: it needs no trust
    untrusted = repo_settings(repo)
    assert untrusted.compiler and untrusted.ignored == ()
    assert launch_spec(settings, repo).compiler
    (repo / ".clover" / "config.toml").write_text('[sandbox]\ncompiler = "gcc"\n')
    with pytest.raises(UsageError, match=r"\[sandbox\] compiler must be true or false"):
        launch_spec(settings, repo)
    # the variant's tag is a hash of the image it is built FROM (and of its recipe)
    assert compiler_tag("sha256:1") == compiler_tag("sha256:1") != compiler_tag("sha256:2")
    assert compiler_tag("sha256:1").startswith("clover-agent-compiler:")


def test_a_failed_c_build_names_the_way_out_that_fits_the_image() -> None:
    recipe = EnvironmentRecipe(steps=())
    no_gcc = "error: command 'gcc' failed: No such file or directory"
    plain = advice(recipe, no_gcc)
    assert "`--with-compiler`" in plain and "`compiler = true`" in plain
    assert "clover-agent sandbox build --with-compiler" in plain
    # in the variant, gcc ran: what is missing is more than it has, said so
    header = (
        "src/x.c:1:10: fatal error: ffi.h: No such file or directory\nerror: command '/usr/bin/gcc' failed"
    )
    variant = advice(recipe, header, compiler=True)
    assert "although the sandbox had gcc, libc6-dev and python3-dev" in variant
    assert (
        "libNAME-dev" in variant and "--image IMG" in variant and "Run with `--with-compiler`" not in variant
    )
    assert "Fix the project's dependency files" in advice(recipe, "some other failure", compiler=True)


async def test_an_incomplete_spec_or_unknown_kind_is_a_config_error(repo: Path) -> None:
    with pytest.raises(SandboxConfigError, match="needs an image") as excinfo:
        await DockerSandbox(SandboxSpec(repo=str(repo))).start()
    assert exit_code_for(excinfo.value) == ExitCode.USAGE
    with pytest.raises(SandboxConfigError, match="unknown sandbox kind 'vm'"):
        create_sandbox("vm", sandbox_spec(repo))


async def test_repository_setup_commands_run_before_the_baseline(repo: Path) -> None:
    (repo / ".clover").mkdir()
    (repo / ".clover" / "config.toml").write_text('[sandbox]\nsetup = ["echo prepared > setup.txt"]\n')
    async with LocalSandbox(sandbox_spec(repo)) as sandbox:
        assert await sandbox.read_file("/workspace/setup.txt") == b"prepared\n"
        assert await sandbox.diff() == ""
    assert not (repo / "setup.txt").exists()


#: ``clover-agent ARGS`` on the machine whose host id is HOLD_SANDBOX_HOST_ID (see ``own_leftovers``).
AS_TEST_HOST = (
    "import os, sys; from clover_agent.sandboxes import cleanup; "
    "cleanup.HOST_ID = os.environ['HOLD_SANDBOX_HOST_ID']; "
    "from clover_agent.cli import main; sys.exit(main(sys.argv[1:]))"
)


@pytest.mark.docker
@pytest.mark.xdist_group("sandbox-prune")  # see test_environment_docker.py's prune test
def test_cli_build_is_quick_when_the_image_exists_and_prune_removes_leftovers(
    repo: Path, own_leftovers: str
) -> None:
    build = run_cli("sandbox", "build", "--quiet")
    assert build.returncode == 0, build.stderr
    assert f"built {DEFAULT_SANDBOX_IMAGE}" in build.stdout
    assert docker.from_env().images.get(DEFAULT_SANDBOX_IMAGE)
    child, container_id = start_holder("docker", repo)
    child.kill()
    child.wait(timeout=120)
    assert container_exists(container_id)
    prune = subprocess.run(
        [sys.executable, "-c", AS_TEST_HOST, "sandbox", "prune"], capture_output=True, text=True, timeout=120
    )
    assert prune.returncode == 0 and "removed 1 sandbox container(s)" in prune.stdout, prune.stdout
    assert not container_exists(container_id)


@pytest.mark.docker
def test_cli_build_from_a_missing_base_says_how_to_get_one() -> None:
    build = run_cli("sandbox", "build", "--base", "clover-agent-test-no-such-base:never", "--tag", "unused:x")
    assert build.returncode == ExitCode.SANDBOX_UNAVAILABLE
    assert "clover-agent-test-no-such-base:never is not on this Docker engine" in build.stderr
    assert "leave out --base" in build.stderr and "Traceback" not in build.stderr


@pytest.mark.parametrize("kind", ["local", pytest.param("docker", marks=pytest.mark.docker)])
async def test_a_missing_repository_is_a_usage_error(kind: str, tmp_path: Path) -> None:
    with pytest.raises(SandboxConfigError, match=r"repository folder .*nowhere does not exist") as excinfo:
        await create_sandbox(kind, sandbox_spec(tmp_path / "nowhere")).start()
    assert exit_code_for(excinfo.value) == ExitCode.USAGE


def test_docker_package_missing_is_one_clear_error() -> None:
    """Without the `docker` Python package (blocked in a fresh interpreter), the CLI says how to fix it."""
    code = (
        "import sys; sys.modules['docker'] = None; "
        "from clover_agent.cli import main; sys.exit(main(['sandbox', 'prune']))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == ExitCode.SANDBOX_UNAVAILABLE
    assert "the `docker` Python package is missing" in result.stderr and "pip install" in result.stderr
    assert "--sandbox local" not in result.stderr  # `sandbox prune` does not take it
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
