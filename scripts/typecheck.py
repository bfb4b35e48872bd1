"""Type-check the package with mypy (`make lint`), with the top-level folders where they install.

setup.py installs engine/, kernels/, tools/ and sandboxes/ as ``clover_agent.<folder>``, a mapping
mypy cannot read. So this links the package together as installed in build/typecheck (pyproject.toml's
``mypy_path``), runs mypy there with pyproject.toml's settings (what to check: ``packages`` and
``modules``; arguments are passed on), and reports each error at the real file's path.

Usage: .venv/bin/python scripts/typecheck.py [MYPY ARGUMENTS]
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / "build" / "typecheck"


def siblings(setup_py: Path = ROOT / "setup.py") -> tuple[str, ...]:
    """setup.py's ``SIBLINGS``: the top-level folders it installs under ``clover_agent``."""
    for node in ast.parse(setup_py.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["SIBLINGS"]:
            return tuple(ast.literal_eval(node.value))
    raise SystemExit(f"typecheck: {setup_py} defines no SIBLINGS")


def build_tree(tree: Path = TREE) -> dict[Path, Path]:
    """A fresh ``tree/clover_agent``: a link to each entry of clover_agent/ and one to each sibling
    folder. Returns each link and what it points at."""
    shutil.rmtree(tree, ignore_errors=True)
    package = tree / "clover_agent"
    package.mkdir(parents=True)
    links = {package / e.name: e for e in (ROOT / "clover_agent").iterdir() if e.name != "__pycache__"}
    links |= {package / name: ROOT / name for name in siblings()}
    for link, target in links.items():
        link.symlink_to(target, target_is_directory=target.is_dir())
    return links


def real_paths(report: str, tree: Path = TREE) -> str:
    """``report`` with each path into ``tree`` (relative to the repository or absolute) replaced by
    the real file's."""
    where = re.escape(tree.relative_to(ROOT).as_posix() + "/clover_agent/")
    folders = "|".join(map(re.escape, siblings()))
    pattern = re.compile(rf"(?<![\w./-])({re.escape(str(ROOT))}/)?{where}(?:({folders})/)?")
    return pattern.sub(lambda m: (m[1] or "") + (m[2] or "clover_agent") + "/", report)


def main(args: list[str]) -> int:
    build_tree()
    run = subprocess.run([sys.executable, "-m", "mypy", *args], cwd=ROOT, capture_output=True, text=True)
    sys.stdout.write(real_paths(run.stdout))
    sys.stderr.write(real_paths(run.stderr))
    return run.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
