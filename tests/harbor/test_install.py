"""The libraries a task's container gets (clover_agent/harbor/install.py) are clover-agent's own:
each of ``RUN_REQUIREMENTS`` is a dependency of the installed distribution, directly or through
another, so the container never runs a library the project does not already depend on. That the
list is enough is shown by the real Harbor runs beside this file, in a container with nothing else.
And scripts/harbor-env, which makes Harbor's environment, says so when it finds no Python >= 3.12."""

from __future__ import annotations

import importlib.metadata as metadata
import shutil
import subprocess
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from clover_agent.harbor.install import RUN_REQUIREMENTS

REPO = Path(__file__).resolve().parents[2]


def _name(requirement: str) -> str:
    return canonicalize_name(Requirement(requirement).name)


def _dependencies(distribution: str) -> set[str]:
    """Every distribution ``distribution`` needs installed, through any chain, markers evaluated
    for this machine: its own extras (``dev``, ``harbor``) left out, those its dependencies ask of
    theirs (``markdown-it-py[linkify]``) followed."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(distribution, frozenset[str]())]
    while todo:
        current, extras = todo.pop()
        try:
            requires = metadata.requires(current) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            requirement = Requirement(line)
            marker = requirement.marker
            if marker is not None and not any(marker.evaluate({"extra": e}) for e in extras or {""}):
                continue
            needed = (canonicalize_name(requirement.name), frozenset(requirement.extras))
            if needed not in seen:
                seen.add(needed)
                todo.append(needed)
    return {name for name, _ in seen}


def test_the_containers_libraries_are_among_clover_agents_dependencies() -> None:
    names = {_name(r) for r in RUN_REQUIREMENTS}
    assert "torch" not in names
    missing = names - _dependencies("clover-agent")
    assert not missing, f"not among clover-agent's dependencies: {sorted(missing)}"


def test_the_check_sees_a_library_that_is_not_a_dependency() -> None:
    found = _dependencies("clover-agent")
    assert {"jinja2", "markupsafe"} <= found  # a dependency and one of its own
    assert "pytest" not in found  # the dev extra's


def test_harbor_env_says_when_no_python_312_is_found(tmp_path: Path) -> None:
    """scripts/harbor-env on a machine with no Python >= 3.12 (this PATH: Debian's 3.11 only; no
    pyenv): exit 2 and a message naming what it looked for, nothing made."""
    if shutil.which("python3.12", path="/usr/bin:/bin") or shutil.which("python3.13", path="/usr/bin:/bin"):
        pytest.skip("this machine's /usr/bin has a Python >= 3.12")
    venv = tmp_path / "harbor-venv"
    done = subprocess.run(
        [str(REPO / "scripts" / "harbor-env")],
        env={"PATH": "/usr/bin:/bin", "PYENV_ROOT": str(tmp_path / "no-pyenv"), "HARBOR_VENV": str(venv)},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Harbor needs Python >= 3.12 and none was found" in done.stderr and "HARBOR_PYTHON" in done.stderr
    assert not venv.exists()
