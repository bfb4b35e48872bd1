"""Environment problems told apart from bugs, on real pytest runs in a Docker sandbox with no
project environment (Debian's pytest 7 and no plugins: the environment a project would lack)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clover_agent.handback.diagnosis import diagnose, workspace_module_names
from clover_agent.sandboxes.base import SandboxSpec
from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.settings import DEFAULT_SANDBOX_IMAGE
from clover_agent.tools.run_tests import run_tests_in
from tests.git_repos import make_repo

pytestmark = pytest.mark.docker

FILES = {
    "src/demo/__init__.py": "def one():\n    return 1\n",
    "src/demo/broken.py": "def f(:\n",
    "pyproject.toml": '[project]\nname = "demo"\nversion = "0"\n',
    "t_missing/test_missing.py": "import text_unidecode\n\ndef test_x():\n    pass\n",
    "t_uninstalled/test_uninstalled.py": "import demo\n\ndef test_x():\n    assert demo.one() == 1\n",
    "t_submodule/test_submodule.py": "import sys\nsys.path.insert(0, 'src')\nfrom demo.gone import x\n\n"
    "def test_x():\n    pass\n",
    "t_syntax/test_syntax.py": "import sys\nsys.path.insert(0, 'src')\nimport demo.broken\n\ndef test_x():\n    pass\n",
    "t_assert/test_assert.py": "def test_x():\n    assert 1 == 2\n",
    "t_version/test_version.py": "from pluggy import no_such_name\n\ndef test_x():\n    pass\n",
    "t_metadata/test_metadata.py": "import importlib.metadata\nV = importlib.metadata.version('demo')\n\n"
    "def test_x():\n    pass\n",
    "t_fixture/test_fixture.py": "def test_x(benchmark):\n    benchmark(len, 'x')\n",
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("diagnosis") / "r", FILES)


async def diagnosis_of(repo: Path, target: str, config: str | None = None):
    if config is not None:
        (repo / "pytest.ini").write_text(config)
    try:
        spec = SandboxSpec(
            repo=str(repo), image=os.environ.get("CLOVER_SANDBOX_IMAGE", DEFAULT_SANDBOX_IMAGE)
        )
        async with create_sandbox("docker", spec) as sb:
            report = await run_tests_in(sb, target)
            return diagnose(report, await workspace_module_names(sb)), report
    finally:
        (repo / "pytest.ini").unlink(missing_ok=True)


@pytest.mark.parametrize(
    ("target", "cause", "evidence"),
    [
        ("t_missing", "the module 'text_unidecode' is not installed", "No module named 'text_unidecode'"),
        ("t_uninstalled", "the project's own package 'demo' cannot be imported", "No module named 'demo'"),
        ("t_version", "the installed 'pluggy' has no 'no_such_name'", "cannot import name 'no_such_name'"),
        ("t_metadata", "no installed distribution 'demo'", "PackageNotFoundError"),
        (
            "t_fixture",
            "the fixture 'benchmark' is not found: it comes from pytest-benchmark",
            "fixture 'benchmark'",
        ),
    ],
)
async def test_environment_problems_are_named_with_their_output(
    repo: Path, target: str, cause: str, evidence: str
) -> None:
    problem, report = await diagnosis_of(repo, target)
    assert problem is not None, report.summary()
    assert cause in problem.cause
    assert evidence in problem.evidence and problem.evidence.startswith("The output:")
    assert "To fix the set-up" in problem.remedy
    assert "the agent was not started" in problem.message(target)


@pytest.mark.parametrize(
    ("config", "cause"),
    [
        ("[pytest]\naddopts = --cov=demo\n", "pytest does not know the option(s) --cov=demo"),
        (
            "[pytest]\nrequired_plugins = pytest-nope\n",
            "requires plugins that are not installed: pytest-nope",
        ),
        ("[pytest]\nminversion = 99.0\n", "needs pytest 99.0 or later"),
    ],
)
async def test_pytest_refusing_to_run_is_an_environment_problem(repo: Path, config: str, cause: str) -> None:
    problem, report = await diagnosis_of(repo, "t_assert", config)
    assert problem is not None, report.summary()
    assert cause in problem.cause


@pytest.mark.parametrize("target", ["t_submodule", "t_syntax", "t_assert"])
async def test_bugs_in_the_code_are_left_to_the_agent(repo: Path, target: str) -> None:
    problem, report = await diagnosis_of(repo, target)
    assert report.failed + report.errors == 1
    assert problem is None, problem
