"""``clover-agent ci init``: the bot's GitHub workflows written into a repository, ready to commit.

The workflows (``workflows/``, beside this module) are written with the action pinned to a full
commit SHA (a tag or a branch can move under a workflow that holds write permissions), the CI
workflow's name set, and the model's variables and secret named; then checked: every ``uses:``
pinned, and actionlint and zizmor, where installed, with no findings.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from clover_agent.errors import CloverError, UsageError

WORKFLOWS_DIR = Path(__file__).with_name("workflows")
#: What the shipped workflows hold where the action's reference goes.
PLACEHOLDER = "your-org/clover-agent@CLOVER_AGENT_COMMIT"
#: ``OWNER/REPO@SHA``, the SHA full (40 hex digits).
ACTION_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}@[0-9a-f]{40}")
PINNED = re.compile(r"^\s*-?\s*uses:\s*(\S+)", re.MULTILINE)
CI_WORKFLOW_LINE = "    workflows: [CI]\n"


@dataclass(frozen=True)
class Written:
    """What ``ci init`` wrote (or, with ``--dry-run``, would write), and what the checks found."""

    files: dict[Path, str]
    checked_with: tuple[str, ...]  # the linters that ran (none found: only the pins were checked)


def action_reference(given: str | None, source: Path | None = None) -> str:
    """``OWNER/REPO@SHA`` for the workflows' ``uses:``: ``given``, else the checkout this clover-agent
    runs from (its ``origin`` on GitHub and its HEAD); a :class:`UsageError` saying how otherwise."""
    if given is not None:
        if not ACTION_REF.fullmatch(given):
            raise UsageError(
                f"--action {given!r} must be OWNER/REPO@COMMIT with the commit's full SHA (40 hex digits): "
                "a tag or a branch can move under a workflow that can push"
            )
        return given
    found = _from_checkout(source or Path(__file__).resolve().parents[2])
    if found is None:
        raise UsageError(
            "--action OWNER/REPO@COMMIT is needed: the repository your workflows take clover-agent from "
            "(a fork or a copy in your organisation) and the full SHA of the commit to run"
        )
    return found


def _from_checkout(root: Path) -> str | None:
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    url, head = git("remote", "get-url", "origin"), git("rev-parse", "HEAD")
    match = re.fullmatch(
        r"(?:https://github\.com/|git@github\.com:|ssh://git@github\.com/)([^/]+/[^/]+?)(?:\.git)?/?", url
    )
    reference = f"{match.group(1)}@{head}" if match and head else ""
    return reference if ACTION_REF.fullmatch(reference) else None


def workflows(action: str, *, ci_workflow: str = "CI") -> dict[str, str]:
    """The shipped workflows (file name -> text) with the action pinned and the CI workflow named."""
    if not ci_workflow.strip() or any(c in ci_workflow for c in "\n\r[],'\"#"):
        raise UsageError(
            f"--ci-workflow {ci_workflow!r}: give the name of your CI workflow as its `name:` says"
        )
    texts = {}
    for path in sorted(WORKFLOWS_DIR.glob("*.yml")):
        text = path.read_text(encoding="utf-8")
        assert PLACEHOLDER in text, path
        text = text.replace(PLACEHOLDER, action)
        if CI_WORKFLOW_LINE in text:
            text = text.replace(CI_WORKFLOW_LINE, f"    workflows: [{_yaml_scalar(ci_workflow)}]\n")
        texts[path.name] = text
    return texts


def _yaml_scalar(value: str) -> str:
    plain = re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9 ._-]*", value) and value.strip() == value
    return value if plain else "'" + value.replace("'", "''") + "'"


def write(
    repo: Path, action: str, *, ci_workflow: str = "CI", force: bool = False, dry_run: bool = False
) -> Written:
    """Write the workflows into ``repo``'s ``.github/workflows/`` (refusing to replace one without
    ``force``), then check them; with ``dry_run`` nothing is written and the texts are checked in a
    scratch copy."""
    folder = repo / ".github" / "workflows"
    texts = workflows(action, ci_workflow=ci_workflow)
    files = {folder / name: text for name, text in texts.items()}
    for path in (repo / ".github", folder, *files):
        if path.is_symlink():  # writing through it could land anywhere on this machine
            raise UsageError(
                f"{path.relative_to(repo)} is a symlink; ci init writes only real files and folders"
            )
    existing = [p for p, text in files.items() if p.exists() and p.read_text(errors="replace") != text]
    if existing and not force and not dry_run:
        names = ", ".join(str(p.relative_to(repo)) for p in existing)
        raise UsageError(f"{names} exist and differ from what ci init writes; pass --force to replace them")
    for text in texts.values():
        check_pins(text)
    if dry_run:
        with tempfile.TemporaryDirectory(prefix="clover-ci-init-") as scratch:
            copy = Path(scratch)
            subprocess.run(["git", "init", "-q", str(copy)], check=True)  # actionlint looks for a repository
            (copy / ".github" / "workflows").mkdir(parents=True)
            for name, text in texts.items():
                (copy / ".github" / "workflows" / name).write_text(text, encoding="utf-8")
            return Written(files, lint(copy))
    folder.mkdir(parents=True, exist_ok=True)
    for path, text in files.items():
        path.write_text(text, encoding="utf-8")
    return Written(files, lint(repo))


def check_pins(text: str) -> None:
    """Every ``uses:`` of a workflow is a local action or pinned to a full commit SHA."""
    yaml.safe_load(text)  # it parses
    for reference in PINNED.findall(text):
        if reference.startswith("./"):
            continue
        if not re.fullmatch(r"[^@\s]+@[0-9a-f]{40}", reference):
            raise CloverError(f"a workflow uses {reference!r}, not pinned to a full commit SHA")


def lint(repo: Path) -> tuple[str, ...]:
    """Run actionlint and zizmor on ``repo``'s workflows where they are installed (beside this
    Python, else on PATH); their findings are a :class:`CloverError`. Returns the ones that ran."""
    ran = []
    actionlint, shellcheck, zizmor = _tool("actionlint"), _tool("shellcheck"), _tool("zizmor")
    if actionlint is not None:
        command = [actionlint, "-color=false", *([f"-shellcheck={shellcheck}"] if shellcheck else [])]
        _lint_run("actionlint", command, repo)
        ran.append("actionlint")
    if zizmor is not None:
        command = [zizmor, "--offline", "--persona", "pedantic", "--no-progress", "--format", "plain",
                   ".github/workflows"]  # fmt: skip
        _lint_run("zizmor", command, repo)
        ran.append("zizmor")
    return tuple(ran)


def _tool(name: str) -> str | None:
    beside = Path(sys.executable).with_name(name)
    return str(beside) if beside.exists() else shutil.which(name)


def _lint_run(name: str, command: list[str], repo: Path) -> None:
    try:
        done = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CloverError(f"{name} could not check the workflows: {exc}") from None
    if done.returncode != 0:
        found = (done.stdout + done.stderr).strip()[-3000:]
        raise CloverError(f"{name} found problems in the written workflows:\n{found}")


NEXT_STEPS = """Next, in the repository's settings on GitHub:
- Settings > Secrets and variables > Actions, variables: CLOVER_BASE_URL (an OpenAI-compatible
  server serving Clover, e.g. http://gpu-host:30000/v1) and, if it serves another name than
  `clover`, CLOVER_MODEL_NAME; for the embedded engine on a self-hosted GPU runner instead:
  CLOVER_RUNNER (its labels as JSON), CLOVER_BACKEND=engine and CLOVER_MODEL (the weights' folder).
- Settings > Environments: create `clover-agent` and put the secret CLOVER_API_KEY in it if the
  server wants a key.
Then commit .github/workflows/ and comment `@clover-agent please fix this` on an issue
(docs/ci.md, "Quick start")."""
