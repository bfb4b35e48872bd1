"""The libraries a task's container gets (clover_agent/harbor/install.py) are clover-agent's own:
each of ``RUN_REQUIREMENTS`` is a dependency of the installed distribution, directly or through
another, so the container never runs a library the project does not already depend on. That the
list is enough is shown by the real Harbor runs beside this file, in a container with nothing else."""

from __future__ import annotations

import importlib.metadata as metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from clover_agent.harbor.install import RUN_REQUIREMENTS


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
