"""Tasks in the SWE-bench instance shape, loaded from a folder per task or a file of them.

A task folder holds ``task.json`` (the fields below but the patches) beside ``test.patch`` and
``gold.patch``; a file (JSON Lines, a JSON list, parquet with ``pyarrow``: the SWE-bench datasets
as published) holds tasks with the patches inline. ``repo``: ``{"sdist": "name==version"}``,
``{"path": DIR}``, ``{"git": URL, "commit": REV}``, or SWE-bench's ``"owner/name"`` (GitHub, at
``base_commit``). Every problem is a :class:`TaskError` naming the file and the field; in a file
a bad task is named and skipped. Test ids are data, any runner's; :attr:`Task.unrunnable` says why
the harness (pytest-style targets) cannot run a task's, and the task fails with that when run.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clover_agent.errors import UsageError
from clover_agent.eval.gitsource import GitSourceError, check_url

TASK_FILE = "task.json"
TEST_PATCH_FILE = "test.patch"
GOLD_PATCH_FILE = "gold.patch"
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_SDIST = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)")
#: SWE-bench's ``repo``: a GitHub repository's "owner/name".
_GITHUB_REPO = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.-]{0,99})/([A-Za-z0-9_.][A-Za-z0-9_.-]{0,99})")
#: A revision to fetch: a commit id, a branch or a tag (no option, no refspec, no range).
_REV = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./+-]{0,199}")
_DJANGO_ID = re.compile(r"\S+ \([\w.]+\)")
#: SWE-bench's optional fields, kept as given (as text).
SWEBENCH_FIELDS = ("base_commit", "version", "environment_setup_commit", "hints_text", "created_at")


#: ``environment`` keys: each a list of strings but ``install_project`` (a bool).
ENVIRONMENT_KEYS = ("requirements", "extras", "packages", "install_project")


class TaskError(UsageError):
    """A task that cannot be used, with where and why."""


@dataclass(frozen=True)
class RepoSource:
    kind: str  # "sdist" | "path" | "git"
    value: str  # name==version, a folder, a URL
    commit: str = ""  # git only: the revision to check out ("": the default branch)

    def describe(self) -> str:
        return f"{self.kind} {self.value}" + (f"@{self.commit}" if self.commit else "")


@dataclass(frozen=True)
class Task:
    instance_id: str
    repo: RepoSource
    problem_statement: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    test_patch: str
    patch: str  # the gold patch
    setup: tuple[str, ...] = ()  # shell commands run in the sandbox before the tests (as root of the repo)
    #: The project environment's choices where the files found would choose wrong (the keys of
    #: :data:`ENVIRONMENT_KEYS`, as in ``.clover/config.toml``'s ``[sandbox]``).
    environment: dict[str, Any] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)  # where the bug and the fix come from
    origin: str = ""  # the file it was read from
    #: SWE-bench's fields where the task has them (:data:`SWEBENCH_FIELDS`), as text.
    swebench: dict[str, str] = field(default_factory=dict)

    @property
    def unrunnable(self) -> str:
        """Why this harness cannot run the task's test ids ("" when it can): it runs pytest-style
        targets (``path.py::name[param]``, a file, a folder), given to the runner space-separated."""
        for test_id in (*self.fail_to_pass, *self.pass_to_pass):
            if _DJANGO_ID.fullmatch(test_id):
                kind = "django's test runner's (`test_x (module.Class)`)"
            elif re.fullmatch(r"[A-Za-z_]\w*", test_id):
                kind = "a bare test name (as sympy's bin/test takes)"
            elif any(c.isspace() for c in test_id):
                kind = "not a pytest node id (it holds a space; targets are given space-separated)"
            else:
                continue
            return (
                f"test id {test_id!r} is {kind}: this harness runs pytest-style targets "
                "(path.py::name) only, so the task cannot be run here"
            )
        return ""

    def to_instance(self) -> dict[str, Any]:
        """The task as a SWE-bench instance (the fields that format names)."""
        return {
            "instance_id": self.instance_id,
            "repo": self.repo.describe(),
            "problem_statement": self.problem_statement,
            "FAIL_TO_PASS": list(self.fail_to_pass),
            "PASS_TO_PASS": list(self.pass_to_pass),
            "test_patch": self.test_patch,
            "patch": self.patch,
            **self.swebench,
        }


def _print_skip(message: str) -> None:
    from clover_agent.safe_text import terminal_safe

    print(terminal_safe(f"skipped: {message}"), file=sys.stderr)


def load_tasks(path: Path, on_skip: Callable[[str], None] | None = None) -> list[Task]:
    """The tasks at ``path``: a file of tasks (JSON Lines, a JSON list, parquet), a task folder,
    or a folder of task folders (in name order). In a file, a task that is not valid (or repeats
    an id) is skipped and named to ``on_skip`` (default: a line on stderr); in folders it is an
    error, as are duplicate ids and an empty set."""
    skip = on_skip or _print_skip
    skipped: list[str] = []

    def note(message: str) -> None:
        skipped.append(message)
        skip(message)

    if path.is_file():
        tasks = _from_file(path, note)
    elif (path / TASK_FILE).is_file():
        tasks = [_from_folder(path)]
    elif path.is_dir():
        folders = sorted(p for p in path.iterdir() if (p / TASK_FILE).is_file())
        tasks = [_from_folder(p) for p in folders]
    else:
        raise TaskError(f"{path}: no such task file or folder")
    seen: dict[str, str] = {}
    unique = []
    for task in tasks:
        if task.instance_id in seen:
            message = (
                f"{task.origin}: instance_id {task.instance_id!r} is also the id of {seen[task.instance_id]}"
            )
            if not path.is_file():
                raise TaskError(message)
            note(message)
            continue
        seen[task.instance_id] = task.origin
        unique.append(task)
    if not unique:
        why = f" ({len(skipped)} skipped: {skipped[0]})" if skipped else ""
        raise TaskError(
            f"{path}: no tasks found{why} (a task folder holds {TASK_FILE}; or give a .jsonl, .json "
            "or .parquet file)"
        )
    return unique


def _from_file(path: Path, skip: Callable[[str], None]) -> list[Task]:
    """Each valid task of a JSON Lines, JSON list or parquet file (a bad one named and skipped)."""
    entries: list[tuple[str, Any]]
    if path.suffix.lower() == ".parquet":
        entries = [(f"{path}: row {n}", row) for n, row in enumerate(_parquet_rows(path), start=1)]
    else:
        text = _read(path)
        if text.lstrip().startswith("["):
            items = _json_any(text, str(path))
            if not isinstance(items, list):
                raise TaskError(f"{path}: a JSON file of tasks is a list of objects")
            entries = [(f"{path}: item {n}", item) for n, item in enumerate(items, start=1)]
        else:
            entries = [
                (f"{path}:{n}", line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()
            ]
    tasks = []
    for where, entry in entries:
        try:
            data = _json(entry, where) if isinstance(entry, str) else entry
            if not isinstance(data, dict):
                raise TaskError(f"{where}: a task is a JSON object")
            tasks.append(task_from_dict(data, where))
        except TaskError as exc:
            skip(str(exc))
    return tasks


def _parquet_rows(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq  # type: ignore[import-not-found, import-untyped, unused-ignore]
    except ImportError:
        raise TaskError(
            f"{path}: reading parquet needs the pyarrow package, which is not installed here: "
            "`pip install pyarrow`, or give the dataset as JSON Lines"
        ) from None
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow's own errors (ArrowInvalid, OSError)
        raise TaskError(f"{path}: not a readable parquet file: {exc}") from exc
    return [dict(row) for row in rows]


def _from_folder(folder: Path) -> Task:
    where = str(folder / TASK_FILE)
    data = _json(_read(folder / TASK_FILE), where)
    for key, name in (("test_patch", TEST_PATCH_FILE), ("patch", GOLD_PATCH_FILE)):
        if key not in data and (folder / name).is_file():
            data[key] = _read(folder / name)
    return task_from_dict(data, where, base=folder)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TaskError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise TaskError(f"{path}: not UTF-8 text (byte {exc.start})") from exc


def _json_any(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TaskError(
            f"{where}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from exc
    except RecursionError:
        raise TaskError(f"{where}: not valid JSON (nested too deep)") from None


def _json(text: str, where: str) -> dict[str, Any]:
    data = _json_any(text, where)
    if not isinstance(data, dict):
        raise TaskError(f"{where}: a task is a JSON object")
    return data


def task_from_dict(data: dict[str, Any], where: str, base: Path | None = None) -> Task:
    """One task from its fields (``where`` names it in errors; ``base``: the folder a relative
    ``path`` source is under)."""

    def text(key: str, *, required: bool = True) -> str:
        value = data.get(key, None if required else "")
        if not isinstance(value, str) or (required and not value.strip()):
            raise TaskError(f"{where}: {key} must be a non-empty string")
        return value

    def names(key: str, *, nonempty: bool) -> tuple[str, ...]:
        value = data.get(key, [])
        if isinstance(value, str):  # SWE-bench's files hold these lists as JSON text
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise TaskError(f"{where}: {key} must be a list of test ids") from None
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise TaskError(f"{where}: {key} must be a list of test ids (strings)")
        if nonempty and not value:
            raise TaskError(f"{where}: {key} is empty: a task needs a test that fails before the fix")
        # any runner's ids are data (django's hold spaces); never an option or a control character
        bad = [v for v in value if v.lstrip().startswith("-") or any(ord(c) < 32 for c in v)]
        if bad:
            raise TaskError(
                f"{where}: {key}: {bad[0]!r} is not a test id (no leading '-', no control characters)"
            )
        return tuple(value)

    def optional_text(key: str) -> str:
        value = data.get(key)
        if value is None:
            return ""
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            if key == "created_at" and hasattr(value, "isoformat"):  # parquet's timestamps
                return str(value.isoformat())
            raise TaskError(f"{where}: {key} must be a string")
        return str(value)

    instance_id = text("instance_id")
    if not _ID.fullmatch(instance_id):
        raise TaskError(f"{where}: instance_id {instance_id!r}: letters, digits, '_', '.', '-' only")
    for key in ("test_patch", "patch"):
        if not text(key).lstrip().startswith(("diff ", "--- ")):
            raise TaskError(f"{where}: {key} is not a unified diff (it must start with 'diff' or '---')")
    setup = data.get("setup", [])
    if isinstance(setup, str):
        setup = [setup]
    if not isinstance(setup, list) or not all(isinstance(s, str) for s in setup):
        raise TaskError(f"{where}: setup must be a list of shell commands")
    environment = data.get("environment", {})
    if not isinstance(environment, dict) or set(environment) - set(ENVIRONMENT_KEYS):
        raise TaskError(f"{where}: environment may set only {', '.join(ENVIRONMENT_KEYS)}")
    for key, value in environment.items():
        good = (
            isinstance(value, bool)
            if key == "install_project"
            else (isinstance(value, list) and all(isinstance(v, str) and v for v in value))
        )
        if not good:
            raise TaskError(
                f"{where}: environment.{key} must be {'true or false' if key == 'install_project' else 'a list of strings'}"
            )
    source = data.get("source", {})
    if not isinstance(source, dict):
        raise TaskError(f"{where}: source must be an object (where the bug and the fix come from)")
    swebench = {key: optional_text(key) for key in SWEBENCH_FIELDS if optional_text(key)}
    for key in ("base_commit", "environment_setup_commit"):
        if key in swebench and not _REV.fullmatch(swebench[key]):
            raise TaskError(f"{where}: {key} {swebench[key]!r} is not a commit id")
    repo = _repo(data.get("repo"), where, base, swebench.get("base_commit", ""))
    if not source and isinstance(data.get("repo"), str) and repo.kind == "git":
        source = {"repo": data["repo"], **{k: v for k, v in swebench.items() if k != "hints_text"}}
    return Task(
        instance_id=instance_id,
        repo=repo,
        problem_statement=text("problem_statement"),
        fail_to_pass=names("FAIL_TO_PASS", nonempty=True),
        pass_to_pass=names("PASS_TO_PASS", nonempty=False),
        test_patch=data["test_patch"],
        patch=data["patch"],
        setup=tuple(setup),
        environment=environment,
        source=source,
        origin=where,
        swebench=swebench,
    )


def github_url(repo: str) -> str:
    """SWE-bench's ``"owner/name"`` as the URL of the GitHub repository."""
    return f"https://github.com/{repo}.git"


def _repo(value: Any, where: str, base: Path | None, base_commit: str = "") -> RepoSource:
    if isinstance(value, str):
        if _GITHUB_REPO.fullmatch(value) and ".." not in value:  # SWE-bench's "owner/name"
            if not base_commit:
                raise TaskError(
                    f"{where}: repo {value!r} is a GitHub repository: base_commit must say which commit"
                )
            return RepoSource("git", github_url(value.removesuffix(".git")), base_commit)
        if "==" not in value:
            raise TaskError(
                f'{where}: repo {value!r} must be "owner/name" (a GitHub repository, with base_commit) '
                'or a pinned "name==version" (an sdist)'
            )
        value = {"sdist": value}  # "name==version" for short
    if not isinstance(value, dict) or len({"sdist", "path", "git"} & set(value)) != 1:
        raise TaskError(
            f'{where}: repo must be one of {{"sdist": "name==version"}}, {{"path": DIR}}, '
            '{"git": URL, "commit": REV}'
        )
    if "sdist" in value:
        spec = value["sdist"]
        if not isinstance(spec, str) or not _SDIST.fullmatch(spec):
            raise TaskError(f"{where}: repo.sdist {spec!r} must be a pinned name==version")
        return RepoSource("sdist", spec)
    if "path" in value:
        folder = value["path"]
        if not isinstance(folder, str) or not folder:
            raise TaskError(f"{where}: repo.path must be a folder")
        path = Path(folder).expanduser()
        if not path.is_absolute() and base is not None:
            path = base / path
        return RepoSource("path", str(path))
    url, commit = value["git"], value.get("commit", "") or base_commit
    if not isinstance(url, str) or not url or url.startswith("-"):
        raise TaskError(f"{where}: repo.git must be a repository URL")
    if base is not None and ":" not in url and not url.startswith("/"):
        url = str(base / url)  # a local repository beside the task folder
    try:
        check_url(url)
    except GitSourceError as exc:
        raise TaskError(f"{where}: repo.git: {exc}") from None
    if not isinstance(commit, str) or (commit and not _REV.fullmatch(commit)) or ".." in commit:
        raise TaskError(f"{where}: repo.commit must be a revision (a commit id, a branch or a tag)")
    return RepoSource("git", url, commit)
