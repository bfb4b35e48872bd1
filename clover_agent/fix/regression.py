"""Which tests the ``fix`` workflow checks for regressions: the scope, and the run target it means.

- ``suite`` (default): every test, before the agent and after it.
- ``related``: the test files of the target, and the test files that import a module or name of
  the project that those import (``from pkg.mod import f`` relates files importing ``pkg.mod`` or
  ``pkg.mod.f``; read from the files' ``import`` statements, the project's own top-level modules
  only): the tests a change for this target is most likely to break, in a fraction of the suite's
  time.
- ``none``: no regression run; the verdict then says that only the target was checked.

Each phase runs its regression tests once (the baseline before the agent, the check after it),
in parallel where the project has pytest-xdist (:data:`clover_agent.handback.judging.WORKERS`).
"""

from __future__ import annotations

import ast
import posixpath
import re
from dataclasses import dataclass

from clover_agent.handback.diagnosis import workspace_module_names
from clover_agent.sandboxes.base import WORKSPACE, Sandbox

REGRESSION_SCOPES = ("suite", "related", "none")
DEFAULT_SCOPE = "suite"
_TEST_FILE = re.compile(r"(^|/)(test_[^/]*|[^/]*_test)\.py$")
#: Folders never searched for test files.
_SKIPPED = {".git", ".tox", ".nox", ".venv", "venv", "node_modules", "build", "dist", "__pycache__"}


@dataclass(frozen=True)
class RegressionSelection:
    """What the regression runs cover: ``target`` for ``run_tests`` (None: the whole suite), or
    nothing at all (``scope == "none"``)."""

    scope: str
    target: str | None
    files: tuple[str, ...] = ()  # the related test files

    @property
    def runs(self) -> bool:
        return self.scope != "none"

    def describe(self) -> str:
        if self.scope == "suite":
            return "the whole suite"
        if self.scope == "none":
            return "no regression run (only the target is checked)"
        shown = ", ".join(self.files[:5]) + (
            f" and {len(self.files) - 5} more" if len(self.files) > 5 else ""
        )
        return f"{len(self.files)} related test file{'s' if len(self.files) != 1 else ''} ({shown})"


async def select_regression(sandbox: Sandbox, scope: str, target_tests: list[str]) -> RegressionSelection:
    """The regression tests for ``scope`` given the target's test ids (``tests/test_x.py::...``)."""
    if scope not in REGRESSION_SCOPES:
        raise ValueError(f"unknown regression scope {scope!r}")
    if scope != "related":
        return RegressionSelection(scope, None)
    own = sorted({t.split("::")[0] for t in target_tests if t.split("::")[0].endswith(".py")})
    files = await _test_files(sandbox)
    project = await workspace_module_names(sandbox)
    imports = {f: {m for m in await _imports(sandbox, f) if m.split(".")[0] in project} for f in files}
    wanted = set().union(*(imports.get(f, set()) for f in own)) if own else set()
    related = sorted(set(own) | {f for f, mods in imports.items() if mods & wanted})
    if not related:  # nothing to narrow to (no test files known): check everything
        return RegressionSelection("suite", None)
    return RegressionSelection("related", " ".join(related), tuple(related))


async def _test_files(sandbox: Sandbox) -> list[str]:
    entries = await sandbox.list_files(WORKSPACE, max_depth=6)
    found = []
    for entry in entries:
        rel = entry.path[len(WORKSPACE) + 1 :]
        if entry.is_dir or not _TEST_FILE.search(rel) or _SKIPPED & set(rel.split("/")[:-1]):
            continue
        found.append(rel)
    return sorted(found)


async def _imports(sandbox: Sandbox, rel: str) -> set[str]:
    """The dotted modules ``rel`` imports, each with its parents (``a.b.c`` gives ``a.b`` and
    ``a.b.c``), top-level packages that every test imports (the project itself) left out so they
    do not relate everything to everything."""
    try:
        tree = ast.parse((await sandbox.read_file(f"{WORKSPACE}/{rel}")).decode("utf-8", "replace"))
    except (OSError, SyntaxError, ValueError):
        return set()
    package = posixpath.dirname(rel).replace("/", ".")
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                base = ".".join([*parts[: len(parts) - node.level + 1], *([base] if base else [])])
            names.update(f"{base}.{alias.name}" if base else alias.name for alias in node.names)
            if base:
                names.add(base)
    modules: set[str] = set()
    for name in names:
        parts = name.split(".")
        modules.update(".".join(parts[:i]) for i in range(2, len(parts) + 1))
    return modules
