"""What a failed set-up step's message puts first: the few lines of pip's output that decide it
(the packages its resolver walked back, the conflict it names, its errors), and advice by cause.
pip's wording as pip 23-25 prints it; the Docker tests see the real thing in failing set-ups."""

from __future__ import annotations

from clover_agent.environments.recipe import EnvironmentRecipe
from clover_agent.sandboxes.env_image import advice, decisive_lines

BACKTRACKED = """\
Collecting freezegun (from -r requirements-dev.txt (line 4))
  Downloading freezegun-1.5.1-py3-none-any.whl (17 kB)
INFO: pip is looking at multiple versions of freezegun to determine which version is compatible with other requirements. This could take a while.
  Downloading freezegun-1.5.0-py3-none-any.whl (17 kB)
INFO: pip is looking at multiple versions of freezegun to determine which version is compatible with other requirements. This could take a while.
  Downloading freezegun-0.0.2.tar.gz (2.2 kB)
ERROR: Cannot install -r requirements-dev.txt (line 4) and python-dateutil==0.1.dev2 because these package versions have conflicting dependencies.

The conflict is caused by:
    The user requested python-dateutil==0.1.dev2
    freezegun 1.5.1 depends on python-dateutil>=2.7

To fix this you could try to:
1. loosen the range of package versions you've specified
ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/#dealing-with-dependency-conflicts
"""


def test_the_lines_that_decide_a_backtracked_conflict_come_first() -> None:
    lines = decisive_lines(BACKTRACKED).splitlines()
    assert lines[0] == "pip walked back through the releases of freezegun"
    assert (
        "The conflict is caused by:" in lines and "freezegun 1.5.1 depends on python-dateutil>=2.7" in lines
    )
    assert any(line.startswith("ERROR: ResolutionImpossible") for line in lines)
    assert not any("Downloading" in line for line in lines)  # the noise stays in the tail
    said = advice(EnvironmentRecipe(steps=()), BACKTRACKED)
    assert (
        said.startswith("The requirements conflict")
        and "walked back through the releases of freezegun" in said
    )


def test_a_timeout_names_what_pip_was_walking_through() -> None:
    said = advice(EnvironmentRecipe(steps=(), timeout=600), BACKTRACKED.split("ERROR:")[0], timed_out=True)
    assert "ran past the set-up's limit of 600 s" in said and "releases of freezegun" in said


def test_nothing_stands_out_in_a_plain_failure() -> None:
    assert decisive_lines("Collecting x\n  Downloading x-1.0.tar.gz\n") == ""


#: uv 0.13.9's words for the same kind of conflict (``uv pip install "pytest>=8" "pluggy==0.12"``,
#: as printed to a pipe), and for a requirement no index has.
UV_CONFLICT = """\
Using Python 3.11.2 environment at: /opt/clover/venv
error: No solution found when resolving dependencies
  cause: Because pytest>=8.0.0,<=8.0.2 depends on pluggy>=1.3.0 and pytest==8.1.0 was yanked (reason: See https://github.com/pytest-dev/pytest/issues/12069), we can conclude that pytest>=8.0.0,<=8.1.0 depends on pluggy>=1.3.0.
         And because pytest>=8.1.1,<=8.1.2 depends on pluggy>=1.4, we can conclude that pytest>=8.0.0,<=8.1.2 depends on pluggy>=1.3.0.
         And because you require pytest>=8 and pluggy==0.12, we can conclude that your requirements are unsatisfiable.
"""
UV_NOT_FOUND = """\
error: No solution found when resolving dependencies
  cause: Because nonexistent-pkg was not found in the package registry and you require nonexistent-pkg, we can conclude that your requirements are unsatisfiable.
"""


def test_uvs_conflict_is_said_by_its_reasons_and_as_a_conflict() -> None:
    lines = decisive_lines(UV_CONFLICT).splitlines()
    assert lines[0] == "error: No solution found when resolving dependencies"
    assert lines[1].startswith("cause: Because pytest>=8.0.0,<=8.0.2 depends on pluggy>=1.3.0")
    assert lines[-1].startswith("And because you require pytest>=8 and pluggy==0.12")
    assert not any(line.startswith("Using Python") for line in lines)
    said = advice(EnvironmentRecipe(steps=()), UV_CONFLICT)
    assert said.startswith("The requirements conflict") and "(the conflict uv names is above)" in said
    assert "walked back" not in said  # pip's backtracking words are not borrowed
    # a requirement that is not there is said as such, not as a conflict
    assert advice(EnvironmentRecipe(steps=()), UV_NOT_FOUND).startswith(
        "A requirement is not available on the package index"
    )
    # earlier uvs' glyphs
    old = UV_CONFLICT.replace("error: No", "  × No").replace("  cause: ", "  ╰─▶ ")
    assert decisive_lines(old).splitlines()[:2] == [
        "No solution found when resolving dependencies",
        lines[1].replace("cause: ", "╰─▶ "),
    ]


def test_a_timeout_says_what_the_installer_was_doing_last() -> None:
    said = advice(
        EnvironmentRecipe(steps=(), timeout=20),
        "Resolved 12 packages\nBuilding demo @ file:///workspace\n",
        timed_out=True,
    )
    assert said.startswith("The step ran past the set-up's limit of 20 s")
    assert "(its last line: Building demo @ file:///workspace)" in said
