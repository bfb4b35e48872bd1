"""Make a task of ``bench/tasks`` from a project's two releases: the one with the bug and the next.

Both sdists are fetched from the package index; their diff is split into the test patch (files
under a tests folder, ``test_*.py``, conftests) and the gold patch (the rest of the code: Python and C sources; release
noise such as changelogs, version strings, packaging and docs left out; ``--keep`` and ``--drop``
choose files by prefix). The problem statement, the FAIL_TO_PASS tests and the source (changelog
line, issue) are given on the command line. Usage:
    python bench/make_task.py NAME OLD NEW --id ID --statement TEXT --fail TEST... [--pass TEST...]
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from clover_agent.eval.source import make_repo  # noqa: E402
from clover_agent.eval.tasks import RepoSource  # noqa: E402
from clover_agent.settings import Settings, host_package_index  # noqa: E402

NOISE = re.compile(
    r"(^|/)(PKG-INFO|[^/]*\.egg-info/.*|_version\.py|__version__\.py|__about__\.py|_meta\.py|"
    r"CHANGE[^/]*|HISTORY[^/]*|NEWS[^/]*|README[^/]*|LICENSE[^/]*|MANIFEST\.in|tox\.ini|pyproject\.toml|"
    r"setup\.(py|cfg)|Makefile|ruff\.toml|mypy\.ini|[^/]*\.cfg|\.[^/]+)$|(^|/)(requirements|docs|examples|changelog\.d|\.[^/]+)/"
)
TEST = re.compile(r"(^|/)(tests?|testing)/|(^|/)test_[^/]*\.py$|(^|/)conftest\.py$")
VERSION_LINE = re.compile(r"""^\s*(__version__|version|VERSION)\s*[:=]\s*['"][^'"]*['"]\s*$""")


def files_of(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


def file_diff(name: str, old: bytes | None, new: bytes | None) -> str:
    try:
        a = [] if old is None else old.decode().splitlines(keepends=True)
        b = [] if new is None else new.decode().splitlines(keepends=True)
    except UnicodeDecodeError:  # a binary file (an image of the docs): not part of a text patch
        return ""
    lines = list(
        difflib.unified_diff(
            a,
            b,
            "/dev/null" if old is None else f"a/{name}",
            "/dev/null" if new is None else f"b/{name}",
            n=3,
        )
    )
    out, hunk = [], []
    for line in lines[2:]:
        if line.startswith("@@"):
            out += _keep(hunk)
            hunk = [line]
        else:
            hunk.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    out += _keep(hunk)
    return "".join(lines[:2] + out) if out else ""


def _keep(hunk: list[str]) -> list[str]:
    """A hunk, unless all it changes is a version string."""
    changed = [line[1:] for line in hunk[1:] if line[:1] in "+-"]
    return [] if not hunk or all(VERSION_LINE.match(line) for line in changed) else hunk


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name")
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--id", required=True)
    p.add_argument("--statement", required=True)
    p.add_argument("--fail", nargs="+", required=True)
    p.add_argument("--pass", dest="passing", nargs="*", default=[])
    p.add_argument("--changelog", default="", help="the next release's changelog entry")
    p.add_argument("--issue", default="")
    p.add_argument("--keep", nargs="*", default=[], help="gold files (prefixes) to keep")
    p.add_argument("--drop", nargs="*", default=[], help="files (prefixes) to leave out")
    p.add_argument("--out", default=str(ROOT / "bench" / "tasks"))
    args = p.parse_args()
    index = host_package_index(Settings.load().environment)
    with tempfile.TemporaryDirectory() as scratch:
        old = files_of(
            make_repo(RepoSource("sdist", f"{args.name}=={args.old}"), Path(scratch) / "old", index)
        )
        new = files_of(
            make_repo(RepoSource("sdist", f"{args.name}=={args.new}"), Path(scratch) / "new", index)
        )
    tests, gold = [], []
    for name in sorted(set(old) | set(new)):
        if old.get(name) == new.get(name) or any(name.startswith(d) for d in args.drop):
            continue
        if NOISE.search(name) and not any(name.startswith(k) for k in args.keep):
            continue
        code = name.endswith((".py", ".pyx", ".pxd", ".c", ".h"))
        if not TEST.search(name) and not code and not any(name.startswith(k) for k in args.keep):
            continue
        if args.keep and not TEST.search(name) and not any(name.startswith(k) for k in args.keep):
            continue
        diff = file_diff(name, old.get(name), new.get(name))
        if diff:
            (tests if TEST.search(name) else gold).append(diff)
    folder = Path(args.out) / args.id
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "test.patch").write_text("".join(tests))
    (folder / "gold.patch").write_text("".join(gold))
    task = {
        "instance_id": args.id,
        "repo": {"sdist": f"{args.name}=={args.old}"},
        "problem_statement": args.statement,
        "FAIL_TO_PASS": args.fail,
        "PASS_TO_PASS": args.passing,
        "source": {
            "bug_in": f"{args.name} {args.old} (sdist)",
            "fixed_in": f"{args.name} {args.new} (sdist): the gold and test patches are the two sdists' diff",
            "changelog": args.changelog,
            "issue": args.issue,
        },
    }
    (folder / "task.json").write_text(json.dumps(task, indent=2) + "\n")
    print(f"{folder}: {len(gold)} gold file(s), {len(tests)} test file(s)")


if __name__ == "__main__":
    main()
