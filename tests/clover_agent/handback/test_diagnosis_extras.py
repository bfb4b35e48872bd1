"""A module missing because the set-up did not install the project's extra that provides it:
the diagnosis names the extra and the line that installs it (real pytest runs, in the local
sandbox: the diagnosis reads the run's report, whatever the sandbox)."""

from __future__ import annotations

from pathlib import Path

from clover_agent.environments.python_deps import EnvironmentOptions, discover
from clover_agent.handback.diagnosis import diagnose, workspace_module_names
from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.tools.run_tests import run_tests_in
from tests.git_repos import make_repo
from tests.sandbox_specs import sandbox_spec

PYPROJECT = (
    '[project]\nname = "demo"\nversion = "1"\n[project.optional-dependencies]\n'
    'test = ["pytest"]\nwidgets = ["clover-widgets-xyz>=1"]\n"evil\\u001b]0;x\\u0007" = ["nothing-here"]\n'
)


async def problem_of(repo: Path, options: EnvironmentOptions):
    recipe = discover(repo, options)
    assert recipe is not None
    async with create_sandbox("local", sandbox_spec(repo)) as sb:
        report = await run_tests_in(sb, "tests")
        return diagnose(report, await workspace_module_names(sb), environment=True, recipe=recipe)


async def test_the_extra_that_provides_a_missing_module_is_named_with_the_line_to_add(tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "r",
        {
            "pyproject.toml": PYPROJECT,
            "tests/test_a.py": "import clover_widgets_xyz\n\ndef test_x():\n    pass\n",
            # a module of the project named as the missing one (pydantic-extra-types has ulid.py)
            "src/demo/clover_widgets_xyz.py": "",
        },
    )
    # the repository's file chose the extras (so the set-up did not add the one the tests import)
    problem = await problem_of(repo, EnvironmentOptions(extras=("test",)))
    assert problem is not None
    assert "the project's extra 'widgets' lists clover-widgets-xyz, which provides it" in problem.cause
    assert "No module named 'clover_widgets_xyz'" in problem.evidence
    assert '  extras = ["test", "widgets"]\n' in problem.remedy
    assert "\x1b" not in problem.message("tests") and "evil" not in problem.message("tests")


async def test_extras_not_installed_are_listed_when_none_is_known_to_provide_the_module(
    tmp_path: Path,
) -> None:
    repo = make_repo(
        tmp_path / "r",
        {
            "pyproject.toml": PYPROJECT,
            "tests/test_a.py": "import clover_gadgets_xyz\n\ndef test_x():\n    pass\n",
        },
    )
    problem = await problem_of(repo, EnvironmentOptions())
    assert problem is not None
    assert (
        problem.cause
        == "the module 'clover_gadgets_xyz' is not installed (No module named 'clover_gadgets_xyz')"
    )
    assert "extras that were not installed (widgets)" in problem.remedy
    assert 'extras = ["test", "NAME"]' in problem.remedy
