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
