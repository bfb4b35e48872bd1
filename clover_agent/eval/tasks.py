"""Tasks in the SWE-bench instance shape, loaded from a folder per task or a JSON Lines file.

A task folder holds ``task.json`` (the fields below but the patches) beside ``test.patch`` and
``gold.patch``; a JSON Lines file has one object per line with the patches inline (``test_patch``,
``patch``). ``repo`` says where the repository comes from: ``{"sdist": "name==version"}`` (fetched
from the package index), ``{"path": DIR}`` or ``{"git": URL, "commit": REV}``. Every problem is a
:class:`TaskError` naming the file and the field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clover_agent.errors import UsageError

TASK_FILE = "task.json"
TEST_PATCH_FILE = "test.patch"
GOLD_PATCH_FILE = "gold.patch"
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_SDIST = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)")


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
        }


def load_tasks(path: Path) -> list[Task]:
    """The tasks at ``path``: a JSON Lines file, a task folder, or a folder of task folders (in
    name order). Duplicate ids and an empty set are errors."""
    if path.is_file():
        tasks = _from_jsonl(path)
    elif (path / TASK_FILE).is_file():
        tasks = [_from_folder(path)]
    elif path.is_dir():
        folders = sorted(p for p in path.iterdir() if (p / TASK_FILE).is_file())
        tasks = [_from_folder(p) for p in folders]
    else:
        raise TaskError(f"{path}: no such task file or folder")
    if not tasks:
        raise TaskError(f"{path}: no tasks found (a task folder holds {TASK_FILE}; or give a .jsonl file)")
    seen: dict[str, str] = {}
    for task in tasks:
        if task.instance_id in seen:
            raise TaskError(
                f"{task.origin}: instance_id {task.instance_id!r} is also the id of {seen[task.instance_id]}"
            )
        seen[task.instance_id] = task.origin
    return tasks


def _from_jsonl(path: Path) -> list[Task]:
    tasks = []
    for number, line in enumerate(_read(path).splitlines(), start=1):
        if line.strip():
            tasks.append(task_from_dict(_json(line, f"{path}:{number}"), f"{path}:{number}"))
    return tasks


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


def _json(text: str, where: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TaskError(
            f"{where}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from exc
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
        bad = [v for v in value if v.startswith("-") or any(c.isspace() for c in v)]
        if bad:
            raise TaskError(f"{where}: {key}: {bad[0]!r} is not a test id (no spaces, no leading '-')")
        return tuple(value)

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
    return Task(
        instance_id=instance_id,
        repo=_repo(data.get("repo"), where, base),
        problem_statement=text("problem_statement"),
        fail_to_pass=names("FAIL_TO_PASS", nonempty=True),
        pass_to_pass=names("PASS_TO_PASS", nonempty=False),
        test_patch=data["test_patch"],
        patch=data["patch"],
        setup=tuple(setup),
        environment=environment,
        source=source,
        origin=where,
    )


def _repo(value: Any, where: str, base: Path | None) -> RepoSource:
    if isinstance(value, str):  # "name==version" for short
        value = {"sdist": value}
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
    url, commit = value["git"], value.get("commit", "")
    if not isinstance(url, str) or not url or url.startswith("-"):
        raise TaskError(f"{where}: repo.git must be a repository URL")
    if not isinstance(commit, str) or commit.startswith("-"):
        raise TaskError(f"{where}: repo.commit must be a revision")
    return RepoSource("git", url, commit)
