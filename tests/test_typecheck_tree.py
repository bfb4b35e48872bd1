"""scripts/typecheck.py links the package together as setup.py installs it, so mypy reads each
module from the file Python imports it from, and its report names the real files."""

from __future__ import annotations

import importlib.util
import runpy
import tomllib
from pathlib import Path

from tests.import_layers import PACKAGE_ROOTS, ROOT

TYPECHECK = runpy.run_path(str(ROOT / "scripts" / "typecheck.py"))


def _module_file(path: Path) -> Path | None:
    if path.is_dir():
        return path / "__init__.py" if (path / "__init__.py").exists() else None
    return path if path.suffix == ".py" else None


def test_each_link_is_where_python_imports_the_module_from(tmp_path: Path) -> None:
    links = TYPECHECK["build_tree"](tmp_path)
    package = tmp_path / "clover_agent"
    assert set(package.iterdir()) == set(links)
    checked: set[str] = set()
    for link, target in links.items():
        real = _module_file(target)
        if real is None:  # not a module
            continue
        name = (
            "clover_agent" if link.name == "__init__.py" else f"clover_agent.{link.name.removesuffix('.py')}"
        )
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        assert Path(spec.origin).resolve() == real.resolve() == _module_file(link).resolve(), name
        checked.add(name)
    assert set(PACKAGE_ROOTS) | {"clover_agent.agent", "clover_agent.protocol"} <= checked


def test_the_tree_maps_the_same_folders_as_the_layer_checker() -> None:
    mapped = {f"clover_agent.{name}": ROOT / name for name in TYPECHECK["siblings"]()}
    assert {"clover_agent": ROOT / "clover_agent", **mapped} == PACKAGE_ROOTS


def test_mypy_is_pointed_at_the_tree() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    tree = TYPECHECK["TREE"].relative_to(ROOT).as_posix()
    assert config["mypy_path"] == f"$MYPY_CONFIG_FILE_DIR/{tree}"


def test_the_report_names_the_real_files() -> None:
    report = (
        "build/typecheck/clover_agent/tools/base.py:3: error: x  [assignment]\n"
        "build/typecheck/clover_agent/agent/loop.py:9: note: see "
        f"{ROOT}/build/typecheck/clover_agent/sandboxes/base.py:4\n"
        "elsewhere/build/typecheck/clover_agent/tools/base.py:1: stays\n"
    )
    assert TYPECHECK["real_paths"](report) == (
        "tools/base.py:3: error: x  [assignment]\n"
        f"clover_agent/agent/loop.py:9: note: see {ROOT}/sandboxes/base.py:4\n"
        "elsewhere/build/typecheck/clover_agent/tools/base.py:1: stays\n"
    )
    for path in ("tools/base.py", "clover_agent/agent/loop.py", "sandboxes/base.py"):
        assert (ROOT / path).is_file()
