"""Environment problems told apart from the bug to fix, before the agent starts.

A target that cannot run because of its environment — a module that is not installed, the project
itself not installed, a pytest plugin or pytest version missing — is not a bug for the agent: the
same failure shows with no change at all, and no edit to the code under test makes it pass.
:func:`diagnose` reads the target's first run (before any change) and names such a cause with the
output that shows it and how to change the set-up; ``fix`` then stops with exit code 4 instead of
starting the agent (see :mod:`clover_agent.fix.workflow`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from clover_agent.environments.extras import EXTRA_NAME, extra_for
from clover_agent.environments.recipe import EnvironmentRecipe
from clover_agent.sandboxes.base import WORKSPACE, Sandbox
from clover_agent.tools.run_tests import TestReport

#: Fixtures that known plugins provide, and the plugin.
PLUGIN_FIXTURES = {
    "benchmark": "pytest-benchmark",
    "mocker": "pytest-mock",
    "freezer": "pytest-freezer",
    "httpx_mock": "pytest-httpx",
    "requests_mock": "requests-mock",
    "snapshot": "syrupy",
    "aioresponses": "aioresponses",
    "event_loop": "pytest-asyncio",
    "celery_app": "celery[pytest]",
    "django_db_setup": "pytest-django",
    "client": "pytest-django or pytest-flask",
}
_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")
_CANNOT_IMPORT = re.compile(r"ImportError: cannot import name '(\w+)' from '([\w.]+)' \(([^)]*)\)")
_NO_METADATA = re.compile(r"PackageNotFoundError: (?:No package metadata was found for )?([\w.\-]+)")
_UNKNOWN_OPTION = re.compile(r"error: unrecognized arguments: (.+)")
_REQUIRED_PLUGINS = re.compile(r"Missing required plugins: (.+)")
_MINVERSION = re.compile(r"'minversion' requires pytest-([\w.]+), actual pytest-([\w.]+)")
_FIXTURE = re.compile(r"fixture '(\w+)' not found")
EVIDENCE_LINES = 12


@dataclass(frozen=True)
class EnvironmentProblem:
    """Why the target cannot run here, the output that shows it, and how to change the set-up."""

    cause: str
    evidence: str
    remedy: str

    def message(self, target: str) -> str:
        return (
            f"the target {target!r} cannot run in the sandbox's environment: {self.cause}. This is not "
            f"the bug to fix (it fails the same before any change), so the agent was not started.\n"
            f"{self.evidence}\n{self.remedy}"
        )


def diagnose(
    report: TestReport,
    workspace_names: set[str],
    *,
    environment: bool = True,
    recipe: EnvironmentRecipe | None = None,
) -> EnvironmentProblem | None:
    """The environment problem that ``report`` (the target's run before any change) shows, or None.

    - ``workspace_names``: the module names the workspace has (``pkg`` for ``pkg/`` or ``pkg.py``, at
      any depth), to tell the project's own modules from installed ones.
    - ``environment``: whether a project environment was set up (the remedy differs).
    - ``recipe``: its recipe; its extras not installed are named when one of them provides a missing module.

    What counts as the environment's fault, and what stays the agent's:

    - ``No module named 'x'`` for a top-level name: not installed, or (when the workspace has
      ``x``) the project not installed; ``No module named 'pkg.sub'`` where the project has
      ``pkg``: a code bug.
    - ``cannot import name 'n' from 'm' (/…/site-packages/m/…)``: an installed package of another
      version than the project needs; the same from the project's own files: a code bug.
    - ``PackageNotFoundError`` (``importlib.metadata`` finds no distribution): not installed.
    - pytest's own refusals: unknown options (a plugin is missing), ``Missing required plugins``,
      ``minversion``, pytest not installed; a fixture a known plugin provides that is not found.
    """
    texts = [f"{f.message}\n{f.traceback}" for f in report.failures if f.kind == "error"]
    if report.problem or not report.outcomes:
        texts.append(report.output)
    for text in texts:
        problem = _explain(text, workspace_names, environment, recipe)
        if problem is not None:
            return problem
    plugin_fixtures = [
        (m[1], PLUGIN_FIXTURES[m[1]])
        for f in report.failures
        if (m := _FIXTURE.search(f.message + "\n" + f.traceback)) and m[1] in PLUGIN_FIXTURES
    ]
    failing = [f for f in report.failures if f.kind in ("failed", "error")]
    if plugin_fixtures and len(plugin_fixtures) == len(failing):
        fixture, plugin = plugin_fixtures[0]
        return EnvironmentProblem(
            f"the fixture {fixture!r} is not found: it comes from {plugin}, which is not installed",
            _evidence(failing[0].traceback or failing[0].message, f"fixture '{fixture}' not found"),
            _remedy(f"add {plugin} to the project's test dependencies", environment),
        )
    return None


def _explain(
    text: str, names: set[str], environment: bool, recipe: EnvironmentRecipe | None
) -> EnvironmentProblem | None:
    if match := _MISSING_MODULE.search(text):
        module = match[1]
        top = module.split(".")[0]
        cause = f"the module {module!r} is not installed (No module named {module!r})"
        others = dict(recipe.other_extras) if environment and recipe is not None else {}
        if recipe is not None and extra_for(module, others, loose=False) is not None:
            # an extra not installed is named for it: that, even where a module of the project
            # has the same name (a project module named ulid beside a missing ``ulid`` package)
            return _missing_extra(module, cause, _evidence(text, match[0]), recipe)
        if "." in module and top in names:
            return None  # a module of the project that is not there: the code's business
        if top in names:
            cause = (
                f"the project's own package {top!r} cannot be imported (No module named {module!r}): the "
                "project is not installed in the environment (a src layout needs it)"
            )
            fix = "install the project (pip install -e .)"
        else:
            fix = f"add the package that provides {top!r} to the project's test dependencies"
            if others and recipe is not None:
                return _missing_extra(module, cause, _evidence(text, match[0]), recipe)
        return EnvironmentProblem(cause, _evidence(text, match[0]), _remedy(fix, environment))
    if (match := _CANNOT_IMPORT.search(text)) and re.search(r"[/\\](site|dist)-packages[/\\]", match[3]):
        return EnvironmentProblem(
            f"the installed {match[2]!r} has no {match[1]!r}: its version is not the one the project needs",
            _evidence(text, match[0]),
            _remedy(f"pin the version of {match[2].split('.')[0]!r} the project needs", environment),
        )
    if match := _NO_METADATA.search(text):
        return EnvironmentProblem(
            f"importlib.metadata finds no installed distribution {match[1]!r}: the project (or that "
            "package) is not installed",
            _evidence(text, match[0]),
            _remedy("install the project (pip install -e .)", environment),
        )
    if match := _UNKNOWN_OPTION.search(text):
        return EnvironmentProblem(
            f"pytest does not know the option(s) {match[1].strip()}: the plugin that adds them is not installed",
            _evidence(text, match[0]),
            _remedy(
                "add the plugin (pytest-cov for --cov, pytest-xdist for -n, ...) to the test dependencies",
                environment,
            ),
        )
    if match := _REQUIRED_PLUGINS.search(text):
        return EnvironmentProblem(
            f"the pytest configuration requires plugins that are not installed: {match[1].strip()}",
            _evidence(text, match[0]),
            _remedy(f"add {match[1].strip()} to the project's test dependencies", environment),
        )
    if match := _MINVERSION.search(text):
        return EnvironmentProblem(
            f"the pytest configuration needs pytest {match[1]} or later; the environment has {match[2]}",
            _evidence(text, match[0]),
            _remedy(f"let the environment install pytest>={match[1]}", environment),
        )
    if "pytest is not installed in the sandbox" in text:
        return EnvironmentProblem(
            "pytest is not installed in the sandbox",
            _evidence(text, "pytest is not installed"),
            _remedy("install pytest", environment),
        )
    return None


def _missing_extra(module: str, cause: str, evidence: str, recipe: EnvironmentRecipe) -> EnvironmentProblem:
    """A missing module and the project's extras the set-up did not install: the one that
    provides it (by its distributions' names), else all of them, with the line that installs it."""
    others = {e: d for e, d in recipe.other_extras if EXTRA_NAME.match(e)}
    found = extra_for(module, others)
    if found is not None:
        extra, dist = found
        line = "extras = " + json.dumps([*recipe.extras, extra])
        return EnvironmentProblem(
            f"{cause}: the project's extra {extra!r} lists {dist}, which provides it, and the set-up "
            "did not install that extra",
            evidence,
            "To fix the set-up: install the extra, in .clover/config.toml's [sandbox] table:\n"
            f"  {line}\n(the extras to install, instead of those found); the environment is then set "
            "up again on the next run.",
        )
    listed = ", ".join(sorted(others))
    line = "extras = " + json.dumps([*recipe.extras, "NAME"])
    return EnvironmentProblem(
        cause,
        evidence,
        f"To fix the set-up: when one of the project's extras that were not installed ({listed}) "
        f"provides {module.split('.')[0]!r}, name it in .clover/config.toml's [sandbox] table:\n  {line}\n"
        "else add the package that provides it to the project's test dependencies (an extra named "
        'test, a dependency group or requirements-test.txt) or to packages = ["..."]; the environment '
        "is then set up again on the next run.",
    )


def _evidence(text: str, needle: str) -> str:
    """The lines of ``text`` up to the one holding ``needle`` (the last :data:`EVIDENCE_LINES`)."""
    # pytest's frame lines name where it happened; its "Traceback:" headers and ^^^ markers add noise
    lines = [
        line
        for line in text.strip("\n").splitlines()
        if line.strip() and "Traceback" not in line and not re.fullmatch(r"\s*[\^~]+\s*", line)
    ]
    at = next((i for i, line in enumerate(lines) if needle in line), len(lines) - 1)
    shown = lines[max(0, at - EVIDENCE_LINES + 1) : at + 1]
    return "The output:\n" + "\n".join(f"  {line}" for line in shown)


def _remedy(what: str, environment: bool) -> str:
    if environment:
        return (
            f"To fix the set-up: {what}, e.g. in an extra named test, a dependency group or "
            "requirements-test.txt, or name it in .clover/config.toml's [sandbox] table "
            '(packages = ["..."], extras, requirements or setup commands); the environment is then '
            "set up again on the next run."
        )
    return (
        f"To fix the set-up: {what} in the environment the tests run in (the local sandbox uses this "
        'machine\'s Python as it is; the Docker sandbox sets one up unless [sandbox] environment = "none").'
    )


async def workspace_module_names(sandbox: Sandbox) -> set[str]:
    """The module names the workspace has (``pkg`` for a folder ``pkg``, ``mod`` for ``mod.py``),
    three levels deep, so a src layout's packages count."""
    entries = await sandbox.list_files(WORKSPACE, max_depth=3)
    names = set()
    for entry in entries:
        name = entry.path.rsplit("/", 1)[-1]
        if entry.is_dir and name.isidentifier():
            names.add(name)
        elif name.endswith(".py"):
            names.add(name[: -len(".py")])
    return names
