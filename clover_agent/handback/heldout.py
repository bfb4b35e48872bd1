"""Held-out judging: the tree the verdict's run uses, and what the patch changes in what judges it.

The run that decides the verdict executes the starting commit's test infrastructure against the
patched source (as SWE-bench's harness puts its own test files over a model's patch). Every path
of the patch that is part of that infrastructure is put back as it was for that run (a new one is
removed): test files and conftests, pytest's configuration files, modules the original
configuration loads as plugins, import hooks (``.pth``, ``sitecustomize``/``usercustomize``,
package metadata that registers entry points) and new modules that would shadow one pytest
imports before the tests (a new module that shadows another installed one is named only; a module
whose only tests are its own doctests is code under test). Each is also named in the summary
(:attr:`HeldOut.harness`) whatever the verdict, as is any change to a target test's body.
"""

from __future__ import annotations

import ast
import configparser
import posixpath
import re
import tomllib
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from clover_agent.handback.patches import is_test_file
from clover_agent.handback.shadow import EXECUTABLE, SYMLINK, Change
from clover_agent.handback.stock import PatchSet
from clover_agent.handback.weakened import doctest_name
from clover_agent.sandboxes.base import Put

#: The files pytest reads its configuration from.
CONFIG_FILES = frozenset(
    {"pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml", "setup.cfg", "tox.ini"}
)
#: Files Python runs or reads at start-up, wherever a site folder points.
START_UP = frozenset({"sitecustomize.py", "usercustomize.py"})
_PLUGIN_OPTION = re.compile(r"(?:^|[\s\"'\[,=])-p[\s\"',]*([A-Za-z_][\w.]*)")


@dataclass
class HeldOut:
    """What turns the patched workspace into the held-out tree, and what the patch changed there."""

    puts: list[Put] = field(default_factory=list)
    #: The paths put back (or removed) for the held-out run.
    reverted: list[str] = field(default_factory=list)
    #: One line for each change to what judges the patch.
    harness: list[str] = field(default_factory=list)


def _pytest_section(name: str, data: bytes | None) -> object:
    """The pytest part of a configuration file (None where it has none or cannot be read)."""
    if data is None:
        return None
    text = data.decode("utf-8", "replace")
    if name == "pyproject.toml":
        try:
            return tomllib.loads(text).get("tool", {}).get("pytest")
        except tomllib.TOMLDecodeError:
            return text
    if name in ("pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml"):
        return text
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text)
    except configparser.Error:
        return text
    section = "tool:pytest" if name == "setup.cfg" else "pytest"
    return dict(parser[section]) if parser.has_section(section) else None


def _addopts(name: str, data: bytes) -> str:
    """The ``addopts`` of a configuration file's pytest part, as text ("" when it has none)."""
    section = _pytest_section(name, data)
    if isinstance(section, str):  # a file that is pytest's alone (or could not be parsed)
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read_string(section)
            return parser.get("pytest", "addopts", fallback="")
        except configparser.Error:
            match = re.search(r"addopts\s*=\s*(.*)", section)
            return match.group(1) if match else ""
    if isinstance(section, dict):
        table = section.get("ini_options", section)
        value = table.get("addopts", "") if isinstance(table, dict) else ""
        return " ".join(map(str, value)) if isinstance(value, list) else str(value)
    return ""


def plugin_modules(files: dict[str, bytes]) -> set[str]:
    """Module names the original configuration loads as plugins: ``-p NAME`` in a configuration
    file's pytest ``addopts``, ``pytest_plugins`` in a conftest."""
    names: set[str] = set()
    for path, data in files.items():
        base = posixpath.basename(path)
        if base in CONFIG_FILES:
            names |= {m for m in _PLUGIN_OPTION.findall(" " + _addopts(base, data)) if m != "no"}
        elif base == "conftest.py":
            try:
                tree = ast.parse(data)
            except (SyntaxError, ValueError):
                continue
            for node in tree.body:
                if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "pytest_plugins" for t in node.targets
                ):
                    names |= {
                        n.value
                        for n in ast.walk(node.value)
                        if isinstance(n, ast.Constant) and isinstance(n.value, str)
                    }
    return names


def _module_paths(modules: set[str]) -> set[str]:
    """Where in the repository a module of ``modules`` may live (its own file, not its packages')."""
    found = set()
    for module in modules:
        for prefix in ("", "src/"):
            stem = prefix + module.replace(".", "/")
            found |= {stem + ".py", stem + "/__init__.py"}
    return found


def files_with_tests(test_ids: Iterable[str]) -> frozenset[str]:
    """The files that hold the tests ``test_ids`` name, but a module whose tests there are all its
    own doctests: that module is code under test (held out, a fix in it would go with it; what
    its doctests check is compared instead: :func:`~clover_agent.handback.weakened.changed_doctests`)."""
    by_file: dict[str, list[str]] = {}
    for test_id in test_ids:
        by_file.setdefault(test_id.split("::")[0], []).append(test_id)
    return frozenset(
        path
        for path, ids in by_file.items()
        if is_test_file(path) or not all(doctest_name(test_id) is not None for test_id in ids)
    )


def _import_hook(path: str) -> str | None:
    base = posixpath.basename(path)
    if base.endswith((".pth", ".egg-link")):
        return f"{path}: a {base.rsplit('.', 1)[1]} file, read when Python starts"
    if base in START_UP:
        return f"{path}: a {base[:-3]} module, run when Python starts"
    if base == "entry_points.txt" or re.search(r"\.(dist|egg)-info/", path):
        return f"{path}: package metadata (it can register pytest plugins)"
    return None


def _shadowed(path: str, final: set[str], installed: set[str]) -> str | None:
    """The installed module a new file would hide, if it is a top-level module or package where it lies."""
    if not path.endswith(".py"):
        return None
    folder, base = posixpath.split(path)
    if base == "__init__.py":
        folder, name = posixpath.split(folder)
    else:
        name = base[:-3]
    in_package = posixpath.join(folder, "__init__.py") in final if folder else "__init__.py" in final
    return name if name in installed and not in_package else None


def _function_defs(tree: ast.Module, qualname: list[str]) -> list[ast.AST]:
    """Every definition of ``Class.func`` in ``tree`` (Python keeps the last)."""
    scopes: list[list[ast.stmt]] = [tree.body]
    for part in qualname[:-1]:
        scopes = [
            [*n.body] for scope in scopes for n in scope if isinstance(n, ast.ClassDef) and n.name == part
        ][-1:]
    return [
        n
        for scope in scopes
        for n in scope
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign))
        and _defines(n, qualname[-1])
    ]


def _defines(node: ast.AST, name: str) -> bool:
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    return getattr(node, "name", None) == name


def changed_target_tests(
    target_ids: list[str], before: dict[str, bytes], after: dict[str, bytes]
) -> list[str]:
    """The target tests whose definition the patch changes (or defines again further down)."""
    found = []
    for test_id in target_ids:
        path, _, rest = test_id.partition("::")
        if not rest or path not in before or path not in after or before[path] == after[path]:
            continue
        try:
            old, new = ast.parse(before[path]), ast.parse(after[path])
        except (SyntaxError, ValueError):
            found.append(f"{test_id}: its file no longer parses")
            continue
        qualname = re.sub(r"\[.*\]$", "", rest).split("::")
        old_defs, new_defs = _function_defs(old, qualname), _function_defs(new, qualname)
        if len(new_defs) > max(len(old_defs), 1):
            found.append(f"{test_id}: defined {len(new_defs)} times in its file (the last one runs)")
        elif not new_defs:
            found.append(f"{test_id}: no longer defined")
        elif not old_defs or ast.dump(old_defs[-1]) != ast.dump(new_defs[-1]):
            found.append(f"{test_id}: the test's body changed")
    return list(dict.fromkeys(found))


def held_out(
    patch: PatchSet,
    *,
    target_ids: list[str],
    installed: set[str],
    harness_modules: AbstractSet[str],
    test_files: frozenset[str] = frozenset(),
    keep: frozenset[str] = frozenset(),
) -> HeldOut:
    """The held-out tree for ``patch`` (see the module docstring).

    - ``installed``: the module names the sandbox's Python has outside the workspace.
    - ``harness_modules``: those of them pytest imports before any test.
    - ``test_files``: the files that held a test before the change (held out whatever their name).
    - ``keep``: test files that stay as patched (a change made from a request is shown by the tests it adds).

    A new module shadowing a harness module is left out of the held-out run; one shadowing another
    installed module is only named: it is code under test, with no more power than the rest.
    """
    base_files = patch.shadow.files(patch.base)
    final = set(patch.shadow.files(patch.final))
    configuration = patch.shadow.blobs(
        {
            p: oid
            for p, (mode, oid) in base_files.items()
            if mode != SYMLINK and posixpath.basename(p) in CONFIG_FILES | {"conftest.py"}
        }
    )
    plugins = _module_paths(plugin_modules(configuration))
    result = HeldOut()
    touched: list[Change] = []
    for change in patch.changes:
        path, why = change.path, None
        base = posixpath.basename(path)
        if path in keep:
            continue
        if base == "conftest.py":
            why = f"{path}: {'a new' if change.status == 'added' else 'a changed'} conftest.py"
        elif base in CONFIG_FILES:
            why = ""  # put back, and named, below when its pytest part changed
        elif is_test_file(path) or path in test_files:
            why = f"{path}: {change.status} test file"
        elif path in plugins:
            why = f"{path}: a plugin the pytest configuration loads"
        elif (hook := _import_hook(path)) is not None:
            why = hook
        elif (
            change.status == "added"
            and (name := _shadowed(path, final, installed | harness_modules)) is not None
        ):
            if name not in harness_modules:
                result.harness.append(f"{path}: a new module that shadows the installed `{name}`")
                continue
            why = f"{path}: a new module that shadows the installed `{name}`"
        if why is None:
            continue
        touched.append(change)
        result.reverted.append(path)
        if why:
            result.harness.append(why)
    old = patch.shadow.blobs({c.path: c.old_oid for c in touched if c.old_mode})
    new = patch.shadow.blobs({c.path: c.new_oid for c in touched if c.new_mode and c.new_mode != SYMLINK})
    for change in list(touched):
        base = posixpath.basename(change.path)
        if base in CONFIG_FILES:
            if _pytest_section(base, old.get(change.path)) == _pytest_section(base, new.get(change.path)):
                touched.remove(change)  # its pytest part is the starting commit's: nothing to put back
                result.reverted.remove(change.path)
                continue
            result.harness.append(f"{change.path}: the pytest configuration changed")
        if not change.old_mode:
            result.puts.append(Put(change.path, "absent"))
        elif change.old_mode == SYMLINK:
            target = old[change.path].decode("utf-8", "surrogateescape")
            result.puts.append(Put(change.path, "link", target=target))
        else:
            mode = 0o755 if change.old_mode == EXECUTABLE else 0o644
            result.puts.append(Put(change.path, "file", mode, old[change.path]))
    result.harness += changed_target_tests(target_ids, old, new)
    return result
