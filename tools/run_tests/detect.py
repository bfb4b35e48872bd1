"""Which test framework a workspace uses (the order is in :mod:`clover_agent.tools.run_tests`)."""

from __future__ import annotations

import configparser
import json
import re
import tomllib

from clover_agent.sandboxes.base import WORKSPACE, Sandbox

PYTHON_TEST_FILE = re.compile(r"(^|/)(test_[^/]*|[^/]*_test)\.py$")
#: Pick the first Python that has pytest (or, for unittest, the first Python at all).
FIND_PYTHON = (
    'for __py in python3 python; do if command -v "$__py" >/dev/null 2>&1 && '
    '"$__py" -c "import pytest" >/dev/null 2>&1; then break; fi; __py=; done'
)
#: A configuration file larger than this is not read (it is not a configuration file).
CONFIG_MAX_BYTES = 1024 * 1024
#: How deep test files are looked for: near the top, then (no tests nor other project file there)
#: as deep as a namespace package's tests in a src layout lie (``src/zope/exceptions/tests/``).
SHALLOW_DEPTH, DEEP_DEPTH = 3, 6


async def _read_text(sandbox: Sandbox, rel: str) -> str | None:
    """The file's text, or None when it is missing, not a regular file, or too large to be a
    configuration file."""
    try:
        data = await sandbox.read_file(f"{WORKSPACE}/{rel}", max_bytes=CONFIG_MAX_BYTES)
    except OSError:
        return None
    return data.decode("utf-8", "replace")


def _has_pytest_config(name: str, text: str) -> bool:
    if name in ("pytest.toml", ".pytest.toml", "pytest.ini", "conftest.py"):
        return True
    if name == "pyproject.toml":
        try:
            return "pytest" in tomllib.loads(text).get("tool", {})
        except tomllib.TOMLDecodeError:
            return "[tool.pytest" in text
    section = {"setup.cfg": "tool:pytest", "tox.ini": "pytest"}[name]
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text)
    except configparser.Error:
        return f"[{section}]" in text
    return parser.has_section(section)


def npm_test_script(text: str) -> str | None:
    try:
        script = json.loads(text).get("scripts", {}).get("test")
    except (json.JSONDecodeError, AttributeError):
        return None
    if not isinstance(script, str) or "no test specified" in script:
        return None
    return script


def _has_python_tests(rels: set[str]) -> bool:
    return any(PYTHON_TEST_FILE.search(rel) and not rel.startswith(".") for rel in rels)


async def detect_framework(sandbox: Sandbox) -> str:
    """The test framework of the workspace (see the module docstring), or "none"."""
    entries = await sandbox.list_files(WORKSPACE, max_depth=SHALLOW_DEPTH)
    rels = {e.path[len(WORKSPACE) + 1 :] for e in entries if not e.is_dir and not e.special}
    for name in (
        "pytest.toml",
        ".pytest.toml",
        "pytest.ini",
        "conftest.py",
        "pyproject.toml",
        "setup.cfg",
        "tox.ini",
    ):
        if name in rels:
            text = await _read_text(sandbox, name)
            if text is not None and _has_pytest_config(name, text):
                return "pytest"
    others = {"package.json", "go.mod", "Cargo.toml"}
    if not _has_python_tests(rels) and not others & rels:  # only a Python project's tests lie deeper
        deeper = await sandbox.list_files(WORKSPACE, max_depth=DEEP_DEPTH)
        rels |= {e.path[len(WORKSPACE) + 1 :] for e in deeper if not e.is_dir and not e.special}
    if _has_python_tests(rels):
        probe = await sandbox.exec(f'{FIND_PYTHON}; [ -n "$__py" ]', timeout=60, cwd=WORKSPACE)
        return "pytest" if probe.exit_code == 0 else "unittest"
    if "package.json" in rels:
        text = await _read_text(sandbox, "package.json")
        if text is not None and npm_test_script(text):
            return "npm"
    if "go.mod" in rels:
        return "go"
    if "Cargo.toml" in rels:
        return "cargo"
    return "none"
