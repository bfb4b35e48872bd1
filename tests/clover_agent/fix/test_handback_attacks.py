"""Hostile agents against the hand-back: what reaches the user's tree is computed on the host, is
exactly what was verified, names every file it touches, and is applied all or nothing.

Each test replays an agent (recorded turns, not a model) that fixes the calculator and also
attacks; everything else is real: Docker sandboxes, pytest runs, git repositories, the apply.
Each ends with the user's tree either untouched or exactly the verified result, and a clear message.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path

import pytest

from clover_agent.cli import main
from clover_agent.errors import ExitCode
from clover_agent.fix import handback
from clover_agent.fix.task import PATCH_FILE, SUMMARY_FILE
from clover_agent.sandboxes import create_sandbox
from clover_agent.tui.handback import ApplyOutcome, Handback
from tests.ci.ci_runs import run_ci
from tests.clover_agent.fix.stocked import stocked_report
from tests.clover_agent.fix.test_fix import calculator_repo, run_dirs, suite_passes
from tests.clover_agent.test_agent_loop import call, write_replay
from tests.git_repos import git
from tests.sandbox_specs import sandbox_spec

pytestmark = [pytest.mark.slow, pytest.mark.docker]

#: Fixes ``add`` only (its first ``return a - b``; ``subtract``'s stays).
FIX_ADD = call(
    "shell",
    command="sed -i '0,/return a - b/s//return a + b/' calculator.py && grep -n 'a [-+] b' calculator.py",
)
FIXED_ADD = '"""Return the sum of a and b."""\n    return a + b\n'
FINISH = call("finish", summary="Fixed add.")


def fix(
    repo: Path, tmp_path: Path, capsys, turns: list[str], *options: str, sandbox: str = "docker"
) -> tuple[int, str, str, dict]:
    """``clover-agent fix test_add`` (in Docker unless ``sandbox`` says otherwise) on ``turns``;
    (exit code, stdout, stderr, summary.json), checked to agree with the trajectory's last line."""
    replay = write_replay(tmp_path / f"replay-{len(list(tmp_path.iterdir()))}.jsonl", turns)
    code = main(["fix", "test_add", "--repo", str(repo), "--backend", "replay", "--replay", str(replay),
                 "--sandbox", sandbox, *options])  # fmt: skip
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    (run,) = run_dirs(repo)
    summary = json.loads((run / SUMMARY_FILE).read_text())
    last = json.loads((run / "trajectory.jsonl").read_text().splitlines()[-1])
    assert last["type"] == "task_finished" and last["exit_code"] == code == summary["exit_code"]
    return code, out.out, out.err, summary


def tree(repo: Path) -> dict[str, bytes]:
    """The user's files (``.git`` and run records aside), to compare before and after."""
    found = {}
    for path in sorted(repo.rglob("*")):
        rel = path.relative_to(repo).as_posix()
        if rel.startswith((".git/", ".clover/")) or rel in (".git", ".clover") or "__pycache__" in rel:
            continue
        if path.is_symlink():
            found[rel] = b"-> " + os.fsencode(os.readlink(path))
        elif path.is_file():
            found[rel] = path.read_bytes() + (b" [x]" if path.stat().st_mode & stat.S_IXUSR else b"")
    return found


def test_an_external_diff_driver_and_global_git_config_cannot_shape_the_patch(tmp_path: Path, capsys) -> None:
    """Before: ``diff.external`` set in the sandbox's .git/config or $HOME/.gitconfig printed any
    patch text, and a headerless hunk creating conftest.py was applied, unnamed."""
    evil = (
        "printf '%s\\n' '#!/bin/sh' 'printf -- \"--- /dev/null\\n+++ b/conftest.py\\n@@ -0,0 +1 @@\\n+import os\\n\"' "
        "> /tmp/evil-diff && chmod +x /tmp/evil-diff && git config diff.external /tmp/evil-diff "
        "&& git config --global diff.external /tmp/evil-diff && git config --global core.pager /tmp/evil-diff "
        "&& printf '* diff=evil\\n' > /tmp/attrs && git config --global core.attributesFile /tmp/attrs "
        "&& git config --global diff.evil.textconv /tmp/evil-diff && git diff HEAD | head -3"
    )
    repo = calculator_repo(tmp_path)
    before = tree(repo)
    code, out, _, summary = fix(
        repo, tmp_path, capsys, [FIX_ADD, call("shell", command=evil), FINISH], "--yes"
    )
    assert code == ExitCode.OK, out
    assert summary["files_changed"] == ["calculator.py"] and summary["hand_back"] == "applied"
    after = tree(repo)
    assert {k for k in set(after) | set(before) if after.get(k) != before.get(k)} == {"calculator.py"}
    assert FIXED_ADD in (repo / "calculator.py").read_text() and suite_passes(repo)
    (run,) = run_dirs(repo)
    patch = (run / PATCH_FILE).read_text()
    assert patch.count("diff --git") == 1 and "conftest" not in patch
    assert "diff.external" not in git(repo, "config", "--list", "--local")


DAEMONS = (
    # A setsid daemon that breaks `add` once the agent is done, and a double-forked one (its own
    # process group) that plants a conftest.py turning every failure into a pass.
    "setsid sh -c 'sleep 4; while :; do sed -i s/a\\ +\\ b/a\\ -\\ b/ /workspace/calculator.py; sleep 0.2; done' "
    ">/dev/null 2>&1 </dev/null & "
    '( set -m; ( sleep 4; printf "import pytest\\n@pytest.hookimpl(hookwrapper=True)\\ndef pytest_runtest_makereport(item, call):\\n'
    "    outcome = yield\\n    outcome.get_result().outcome = 'passed'\\n\" > /workspace/conftest.py ) "
    ">/dev/null 2>&1 </dev/null & ) ; sleep 1; echo started"
)


@pytest.mark.parametrize("kind", ["docker", "local"])
def test_daemons_editing_after_the_agent_finished_change_nothing_shipped(
    kind: str, tmp_path: Path, capsys
) -> None:
    """Before: a setsid process survived its command and changed the workspace between the diff
    and the verification (a broken `add` was applied while the verification saw a right one)."""
    repo = calculator_repo(tmp_path)
    replay = write_replay(tmp_path / "daemons.jsonl", [FIX_ADD, call("shell", command=DAEMONS), FINISH])
    code = main(["fix", "test_add", "--repo", str(repo), "--backend", "replay", "--replay", str(replay),
                 "--sandbox", kind, "--yes"])  # fmt: skip
    out = capsys.readouterr()
    assert code == ExitCode.OK, out.out + out.err
    assert "conftest.py" not in tree(repo)
    assert FIXED_ADD in (repo / "calculator.py").read_text() and suite_passes(repo)
    (run,) = run_dirs(repo)
    summary = json.loads((run / SUMMARY_FILE).read_text())
    assert summary["files_changed"] == ["calculator.py"]
    # The verification ran on the same bytes: the suite after the change passed in full.
    assert summary["tests"]["suite_after"]["passed"] == 5 and summary["tests"]["suite_after"]["failed"] == 0


def test_uncommitted_work_in_git_quoted_file_names_never_gets_the_agents_hunk(tmp_path: Path, capsys) -> None:
    """Before: the guard read git's quoted names, so a user's uncommitted café.py received the
    agent's hunk and the summary did not name it."""
    repo = calculator_repo(tmp_path)
    names = ["café.py", "tab\there.py", 'quote"d.py']
    for name in names:
        (repo / name).write_text("VALUE = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "odd names")
    mine = "VALUE = 1\n# my own work\n"
    (repo / "café.py").write_text(mine)
    before = tree(repo)
    edit = call(
        "shell",
        command="for f in café.py \"$(printf 'tab\\there.py')\" 'quote\"d.py'; do echo 'AGENT = 2' >> \"$f\"; done",
    )
    code, out, err, summary = fix(repo, tmp_path, capsys, [FIX_ADD, edit, FINISH], "--yes")
    assert code == ExitCode.FAILURE
    assert "uncommitted changes to café.py" in err
    assert tree(repo) == before  # all or nothing: calculator.py untouched too
    assert set(summary["files_changed"]) == {"calculator.py", *names}
    assert summary["fixed"] and summary["hand_back"].startswith("refused:")
    for name in names:  # every touched file named, as it is called
        assert name in out

    # Without the user's own change, the same patch applies, and every file is named.
    (repo / "café.py").write_text("VALUE = 1\n")
    for run in run_dirs(repo):
        run.rename(tmp_path / f"old-{run.name}")
    code, out, _, summary = fix(repo, tmp_path, capsys, [FIX_ADD, edit, FINISH], "--yes")
    assert code == ExitCode.OK, out
    assert all((repo / name).read_text() == "VALUE = 1\nAGENT = 2\n" for name in names)
    (applied,) = [line for line in out.splitlines() if line.startswith(f"Applied to {repo}: ")]
    assert sorted(applied.split(": ", 1)[1].split(", ")) == sorted(["calculator.py", *names])


def test_a_symlink_to_outside_is_never_applied(tmp_path: Path, capsys) -> None:
    """Before: a tracked file replaced by a symlink to a host path was applied as "changed FILE"."""
    outside = tmp_path / "outside.txt"
    outside.write_text("host file\n")
    repo = calculator_repo(tmp_path)
    (repo / "notes.txt").write_text("notes\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "notes")
    link = call("shell", command=f"rm notes.txt && ln -s {outside} notes.txt && ln -s ../../.. up")
    code, out, _, summary = fix(repo, tmp_path, capsys, [FIX_ADD, link, FINISH], "--yes")
    assert code == ExitCode.OK, out
    assert summary["files_changed"] == ["calculator.py"]
    assert set(summary["left_out"]) == {"notes.txt", "up"}
    assert "outside the repository: never applied" in summary["left_out"]["notes.txt"]
    assert "left out    notes.txt: a symlink to" in out
    assert not (repo / "notes.txt").is_symlink() and (repo / "notes.txt").read_text() == "notes\n"
    assert not os.path.lexists(repo / "up") and outside.read_text() == "host file\n"


@pytest.mark.parametrize("what", ["executable bit", "binary file", "symlink inside"])
def test_mode_changes_binary_files_and_symlinks_need_an_explicit_yes(
    what: str, tmp_path: Path, capsys
) -> None:
    command = {
        "executable bit": "chmod +x calculator.py",
        "binary file": "printf 'PK\\000\\001\\377' > data.bin",
        "symlink inside": "ln -s calculator.py calc.py",
    }[what]
    repo = calculator_repo(tmp_path)
    before = tree(repo)
    code, out, err, summary = fix(
        repo, tmp_path, capsys, [FIX_ADD, call("shell", command=command), FINISH], "--yes"
    )
    assert code == ExitCode.FAILURE and "--yes does not cover them" in err
    assert tree(repo) == before
    note = {
        "executable bit": "executable bit set",
        "binary file": "binary",
        "symlink inside": "a symlink to",
    }[what]
    assert note in out and summary["fixed"] and summary["hand_back"].startswith("refused:")
    changes = {c["path"]: c for c in summary["changes"]}
    assert any(note in n for c in changes.values() for n in c["notes"])


def test_a_clover_symlink_is_refused(tmp_path: Path, capsys) -> None:
    """Before: a committed `.clover` symlink made run records land outside the repository."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    repo = calculator_repo(tmp_path)
    (repo / ".clover").symlink_to(elsewhere)
    replay = write_replay(tmp_path / "replay.jsonl", [FIX_ADD, FINISH])
    code = main(["fix", "test_add", "--repo", str(repo), "--backend", "replay", "--replay", str(replay),
                 "--sandbox", "docker", "--yes"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE and ".clover is a symlink" in err and "Traceback" not in err
    assert list(elsewhere.iterdir()) == []


def test_a_repository_with_hooks_fsmonitor_and_filters_runs_none_of_them(tmp_path: Path, capsys) -> None:
    """Host git never runs the repository's programs, and its textconv/filter drivers (commands of
    this machine) do not break the Docker sandbox's git."""
    marker = tmp_path / "ran"
    script = tmp_path / "evil.sh"
    script.write_text(f'#!/bin/sh\necho "$0 $*" >> {marker}\ncat\n')
    script.chmod(0o755)
    repo = calculator_repo(tmp_path)
    (repo / ".gitattributes").write_text("*.py filter=evil diff=evil\n")
    git(repo, "add", ".gitattributes")
    git(repo, "commit", "-qm", "attributes")
    for key, value in (
        ("core.fsmonitor", str(script)),
        ("filter.evil.clean", str(script)),
        ("filter.evil.smudge", str(script)),
        ("filter.evil.required", "true"),
        ("diff.evil.textconv", str(script)),
        ("diff.external", str(script)),
    ):
        git(repo, "config", key, value)
    hooks = Path(git(repo, "rev-parse", "--absolute-git-dir").strip()) / "hooks"
    for hook in ("pre-commit", "post-checkout", "post-index-change", "reference-transaction", "pre-auto-gc"):
        (hooks / hook).write_text(f"#!/bin/sh\necho hook {hook} >> {marker}\n")
        (hooks / hook).chmod(0o755)
    marker.unlink(missing_ok=True)
    code, out, err, summary = fix(repo, tmp_path, capsys, [FIX_ADD, FINISH], "--yes")
    assert code == ExitCode.OK, out + err
    assert summary["files_changed"] == ["calculator.py"] and summary["hand_back"] == "applied"
    assert FIXED_ADD in (repo / "calculator.py").read_text()
    assert not marker.exists(), marker.read_text()


# Paths never handed back, and the user's tree -----------------------------------------------------


def changed_on_host(before: dict[str, bytes], repo: Path) -> set[str]:
    after = tree(repo)
    return {k for k in set(after) | set(before) if after.get(k) != before.get(k)}


def command_of(turn: str) -> str:
    """The shell command of a replayed ``shell`` call."""
    return turn.split("<parameter=command>\n", 1)[1].split("\n</parameter>", 1)[0]


def commit_files(repo: Path, files: dict[str, str], message: str = "files") -> None:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)


def test_run_records_and_settings_written_under_clover_are_never_handed_back(tmp_path: Path, capsys) -> None:
    """Before: `.clover/runs/<id>/...` and `.clover/config.toml` written by the agent were applied
    (git ignores the run folder on the host, so `git status` stayed clean) and `--resume` ran them."""
    repo = calculator_repo(tmp_path)
    plant = call(
        "shell",
        command="mkdir -p .clover/runs/20990101-evil && echo '{}' > .clover/runs/20990101-evil/summary.json "
        "&& printf '[setup]\\ncommands = [\"sh ./pwn.sh\"]\\n' > .clover/config.toml && mkdir -p sub/.clover "
        "&& echo x > sub/.clover/config.toml",
    )
    code, out, _, summary = fix(repo, tmp_path, capsys, [FIX_ADD, plant, FINISH], "--yes", sandbox="local")
    assert code == ExitCode.OK, out
    assert summary["files_changed"] == ["calculator.py"] and summary["hand_back"] == "applied"
    planted = [".clover/config.toml", ".clover/runs/20990101-evil/summary.json", "sub/.clover/config.toml"]
    assert sorted(summary["left_out"]) == planted
    assert all("never handed back" in summary["left_out"][p] for p in planted)
    assert "left out    .clover/config.toml: inside .clover/: never handed back" in out
    assert not (repo / ".clover" / "config.toml").exists() and not (repo / "sub").exists()
    assert [p.name for p in (repo / ".clover" / "runs").iterdir() if p.is_dir()] == [summary["run_id"]]
    assert FIXED_ADD in (repo / "calculator.py").read_text() and suite_passes(repo)


def test_files_the_host_ignores_are_left_out_even_when_the_agent_unignores_them(
    tmp_path: Path, capsys
) -> None:
    """Before: a `.pth` file under the host-ignored `.venv` (which runs at the next `python`
    start) was applied without being shown once the agent emptied the workspace's .gitignore."""
    repo = calculator_repo(tmp_path)
    commit_files(repo, {".gitignore": ".venv/\n"}, "ignore the environment")
    (repo / ".venv").mkdir()
    (repo / ".venv" / ".gitignore").write_text("*\n")  # as `python -m venv` writes it
    (repo / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (repo / "build").mkdir()
    (repo / "build" / ".gitignore").write_text("*\n")  # ignored only by its own .gitignore, on the host
    before = tree(repo)
    pth = ".venv/lib/python3.11/site-packages/evil.pth"
    plant = call(
        "shell",
        command=f"mkdir -p {pth.rsplit('/', 1)[0]} build && echo 'import os; os.system(\"touch /tmp/pwned\")' > {pth} "
        "&& echo 'x = 1' > build/gen.py && printf '!.venv/\\n' > .gitignore && git status --short | head",
    )
    code, out, err, summary = fix(repo, tmp_path, capsys, [FIX_ADD, plant, FINISH], "--yes")
    assert code == ExitCode.OK, out + err
    assert changed_on_host(before, repo) == {"calculator.py"}
    assert not (repo / pth).exists() and (repo / ".gitignore").read_text() == ".venv/\n"
    assert summary["left_out"][pth].startswith("ignored by your tree (")
    assert "ignored by your tree (build/.gitignore:1: *)" in summary["left_out"]["build/gen.py"]
    assert f"left out    {pth}: ignored by your tree" in out
    # the workspace's .gitignore, edited to un-ignore it, is itself held back under --yes, named
    assert summary["needs_yes"] == {".gitignore": ".gitignore: changes how git treats your files"}
    assert summary["hand_back"] == "applied: calculator.py; not applied: .gitignore"
    assert "Not applied, they need your yes at a terminal" in out
    assert FIXED_ADD in (repo / "calculator.py").read_text() and suite_passes(repo)


NEEDS_YES = {
    ".gitattributes": "* filter=evil\n",
    ".gitignore": "calculator.py\n",
    ".github/workflows/ci.yml": "on: push\njobs: {x: {runs-on: ubuntu-latest, steps: [{run: ./pwn}]}}\n",
    "tools/run.sh": "#!/bin/sh\nsh ./pwn.sh\n",
}
WRITE_NEEDS_YES = call(
    "shell",
    command="mkdir -p .github/workflows tools && printf '* filter=evil\\n' > .gitattributes "
    "&& printf 'calculator.py\\n' > .gitignore "
    "&& printf 'on: push\\njobs: {x: {runs-on: ubuntu-latest, steps: [{run: ./pwn}]}}\\n' > .github/workflows/ci.yml "
    "&& printf '#!/bin/sh\\nsh ./pwn.sh\\n' > tools/run.sh && chmod +x tools/run.sh",
)


def test_git_files_ci_workflows_and_executables_are_left_out_under_yes(tmp_path: Path, capsys) -> None:
    """Before: with --yes, .gitattributes/.gitignore/a workflow were applied as plain text edits."""
    repo = calculator_repo(tmp_path)
    before = tree(repo)
    code, out, _, summary = fix(
        repo, tmp_path, capsys, [FIX_ADD, WRITE_NEEDS_YES, FINISH], "--yes", sandbox="local"
    )
    assert code == ExitCode.OK, out
    assert changed_on_host(before, repo) == {"calculator.py"}
    assert FIXED_ADD in (repo / "calculator.py").read_text() and suite_passes(repo)
    assert sorted(summary["needs_yes"]) == sorted(NEEDS_YES)
    assert summary["needs_yes"]["tools/run.sh"] == "an executable file"
    assert "CI or hook configuration" in summary["needs_yes"][".github/workflows/ci.yml"]
    assert summary["hand_back"].startswith("applied: calculator.py; not applied: ")
    (held,) = [line for line in out.splitlines() if line.startswith("Not applied, they need your yes")]
    assert all(path in held for path in NEEDS_YES)
    changed = next(line for line in out.splitlines() if line.startswith("  changed"))
    assert "tools/run.sh (an executable file)" in changed


def test_a_yes_at_a_terminal_applies_what_needs_one(tmp_path: Path) -> None:
    """The person's own yes (here the question's answer) applies the held files too."""
    repo = calculator_repo(tmp_path)
    report = asyncio.run(stocked_report(repo, tmp_path / "run", command_of(WRITE_NEEDS_YES)))
    asked = []
    code, _ = handback.hand_back(
        report, repo, mode=handback.ASK, confirm=lambda q: asked.append(q) or True, say=print
    )
    assert code == ExitCode.OK and report.hand_back == "applied"
    assert "tools/run.sh (an executable file)" in asked[0]
    for path, text in NEEDS_YES.items():
        assert (repo / path).read_text() == text
    assert os.access(repo / "tools" / "run.sh", os.X_OK)


def test_file_names_with_control_characters_are_refused_and_named(tmp_path: Path, capsys) -> None:
    """Before: a name of escape sequences or backspaces was applied, hiding itself from the lines
    that name the changed files."""
    repo = calculator_repo(tmp_path)
    names = ["evil\x1b[2Kname.py", "\b\b\b\bhidden.py", "line\nbreak.py"]
    plant = call(
        "shell",
        command="touch \"$(printf 'evil\\033[2Kname.py')\" \"$(printf '\\b\\b\\b\\bhidden.py')\" "
        "\"$(printf 'line\\nbreak.py')\" && ls | wc -l",
    )
    code, out, _, summary = fix(repo, tmp_path, capsys, [FIX_ADD, plant, FINISH], "--yes")
    assert code == ExitCode.OK, out
    assert summary["files_changed"] == ["calculator.py"] and summary["hand_back"] == "applied"
    assert sorted(summary["left_out"]) == sorted(names)
    assert all("control characters" in why for why in summary["left_out"].values())
    assert "evil\\x1b[2Kname.py" in out and "\\x08\\x08\\x08\\x08hidden.py" in out
    assert not [p for p in os.listdir(repo) if any(ord(c) < 0x20 for c in p)]
    assert FIXED_ADD in (repo / "calculator.py").read_text() and suite_passes(repo)


@pytest.mark.parametrize("flag", ["--skip-worktree", "--assume-unchanged"])
def test_files_git_hides_the_changes_of_are_the_users_work(flag: str, tmp_path: Path, capsys) -> None:
    """Before: a file marked --skip-worktree / --assume-unchanged with the user's uncommitted edits
    was overwritten by the agent's version (git status shows no change for it)."""
    repo = calculator_repo(tmp_path)
    commit_files(repo, {"settings.py": "DEBUG = False\n"}, "settings")
    git(repo, "update-index", flag, "settings.py")
    mine = "DEBUG = True  # my local setting\n"
    (repo / "settings.py").write_text(mine)
    assert git(repo, "status", "--porcelain") == ""  # git hides it
    before = tree(repo)
    edit = call("shell", command="echo 'AGENT = 1' >> settings.py")
    code, out, err, summary = fix(repo, tmp_path, capsys, [FIX_ADD, edit, FINISH], "--yes", sandbox="local")
    assert f"settings.py ({flag}): marked so git hides their changes" in out + err  # warned at the start
    assert code == ExitCode.FAILURE and summary["fixed"] and summary["hand_back"].startswith("refused:")
    assert "uncommitted changes to settings.py" in err and f"settings.py (marked {flag})" in err
    assert tree(repo) == before and (repo / "settings.py").read_text() == mine


def test_a_path_the_sandbox_cannot_read_is_never_deleted_on_the_host(tmp_path: Path, capsys) -> None:
    """Before: a folder made unreadable in the sandbox (chmod 000) had its files deleted on the host."""
    repo = calculator_repo(tmp_path)
    commit_files(repo, {"data/table.csv": "a,b\n1,2\n", "notes.txt": "notes\n"}, "data")
    before = tree(repo)
    hide = call("shell", command="echo more >> notes.txt && chmod 000 data notes.txt && ls -la | head -20")
    code, out, err, summary = fix(repo, tmp_path, capsys, [FIX_ADD, hide, FINISH], "--yes")
    assert code == ExitCode.OK, out + err
    assert changed_on_host(before, repo) == {"calculator.py"}
    assert (repo / "data" / "table.csv").read_text() == "a,b\n1,2\n"
    assert (repo / "notes.txt").read_text() == "notes\n"
    assert summary["files_changed"] == ["calculator.py"]
    assert {"data", "data/table.csv", "notes.txt"} <= set(summary["left_out"])
    assert "kept as it is in your tree" in summary["left_out"]["data/table.csv"]
    assert FIXED_ADD in (repo / "calculator.py").read_text() and suite_passes(repo)


def test_tens_of_thousands_of_new_files_never_hit_the_argument_limit(tmp_path: Path, capsys) -> None:
    """Before: host git got every path on its command line ("Argument list too long") while
    summary.json and the trajectory said exit 0."""
    repo = calculator_repo(tmp_path)
    folder = "gen/" + "long-folder-name-" * 4  # 30,000 paths of ~80 bytes: past the 2 MiB argv limit
    many = call(
        "shell",
        command=f"mkdir -p {folder} && seq 30000 | split -l 1 -a 4 - {folder}/f- && ls {folder} | wc -l",
    )
    code, out, err, summary = fix(repo, tmp_path, capsys, [FIX_ADD, many, FINISH], "--yes", sandbox="local")
    assert "Argument list too long" not in out + err
    assert code == ExitCode.OK and summary["hand_back"] == "applied", err[-2000:]
    assert len(os.listdir(repo / folder)) == 30000 and (repo / folder / "f-aaab").read_text() == "2\n"
    assert FIXED_ADD in (repo / "calculator.py").read_text()


def test_a_failure_while_applying_is_the_recorded_exit_code(tmp_path: Path, capsys) -> None:
    """A file the user makes where the patch needs a folder (after the run copied the tree) stops
    the apply; summary.json and the trajectory say exit 1, not the verdict's 0, and nothing is left
    behind."""
    repo = calculator_repo(tmp_path)
    # the local sandbox runs on the host: the "user" makes `gen` a file once the copy was taken
    race = call("shell", command=f"mkdir gen && echo new > gen/x.py && echo mine > {repo}/gen")
    code, out, err, summary = fix(repo, tmp_path, capsys, [FIX_ADD, race, FINISH], "--yes", sandbox="local")
    assert code == ExitCode.FAILURE and summary["fixed"], out + err
    assert summary["hand_back"].startswith("refused:") and "gen/x.py" in err
    assert (repo / "gen").read_text() == "mine\n" and "return a - b" in (repo / "calculator.py").read_text()
    assert [p.name for p in (repo / ".clover").iterdir()] == ["runs"]  # no staging folder left


def test_a_nested_repository_and_a_fifo_are_left_out_without_breaking_the_checkpoints(
    tmp_path: Path, capsys
) -> None:
    """Before: `git init sub` or a FIFO in the workspace made the next checkpoint fail (git's
    warnings and errors broke it) and the run ended there."""
    repo = calculator_repo(tmp_path)
    before = tree(repo)
    nest = call(
        "shell",
        command="git init -q sub && echo x > sub/a.txt && git init -q done && echo y > done/b.txt "
        "&& git -C done add -A && git -C done -c user.name=a -c user.email=a@b commit -qm c && mkfifo pipe",
    )
    later = call("shell", command="echo '# checked' >> calculator.py")
    code, out, err, summary = fix(repo, tmp_path, capsys, [nest, FIX_ADD, later, FINISH], "--yes")
    assert code == ExitCode.OK, out + err
    assert "could not snapshot" not in out + err
    assert {"sub", "done", "pipe"} <= set(summary["left_out"])
    assert "nested git repository" in summary["left_out"]["sub"] and "FIFO" in summary["left_out"]["pipe"]
    assert changed_on_host(before, repo) == {"calculator.py"}
    text = (repo / "calculator.py").read_text()
    assert FIXED_ADD in text and text.endswith("# checked\n") and suite_passes(repo)


def test_the_ci_bots_patch_follows_the_same_rules(tmp_path: Path) -> None:
    """The CI bot's patch.diff leaves out what `fix` never hands back and names what needs a yes."""
    repo = calculator_repo(tmp_path)
    commit_files(repo, {".gitignore": ".venv/\n"}, "ignore the environment")
    plant = call(
        "shell",
        command="mkdir -p .clover .venv/lib .github/workflows && echo x > .clover/config.toml "
        "&& echo 'import os' > .venv/lib/evil.pth && echo 'on: push' > .github/workflows/ci.yml && : > .gitignore",
    )
    replay = write_replay(tmp_path / "ci.jsonl", [FIX_ADD, plant, FINISH])
    run = run_ci(repo, tmp_path / "out", "--task", "Adding numbers is wrong", "--target",
                 "tests/test_calculator.py::test_add", "--backend", "replay", "--replay", str(replay))  # fmt: skip
    assert run.code == 0, run.stderr
    result = run.result
    assert sorted(result["left_out"]) == [".clover/config.toml", ".venv/lib/evil.pth"]
    assert sorted(result["needs_yes"]) == [".github/workflows/ci.yml", ".gitignore"]
    assert sorted(result["files_changed"]) == [".github/workflows/ci.yml", ".gitignore", "calculator.py"]
    assert "evil.pth" not in run.patch and ".clover" not in run.patch and "+    return a + b" in run.patch
    assert (
        "- `.venv/lib/evil.pth`: `ignored by your tree (.gitignore:1: .venv/): never handed back`"
        in run.summary
    )
    assert "- `.github/workflows/ci.yml`: `CI or hook configuration" in run.summary


def test_the_tuis_apply_follows_the_same_rules(tmp_path: Path) -> None:
    """/apply in the TUI never writes what `fix` never hands back; the other files chosen go ahead."""
    repo = calculator_repo(tmp_path)
    commit_files(repo, {".gitignore": ".venv/\n"}, "ignore the environment")
    folder = tmp_path / "session"
    folder.mkdir()

    async def session() -> tuple[list[str], ApplyOutcome]:
        async with create_sandbox("local", sandbox_spec(repo)) as sandbox:
            handback = Handback(sandbox, repo, folder, "session")
            await handback.start()
            plant = (
                "mkdir -p .clover .venv/lib && echo x > .clover/config.toml && echo 'import os' > .venv/lib/a.pth "
                "&& : > .gitignore"
            )
            result = await sandbox.exec(f"{command_of(FIX_ADD)} && {plant}", timeout=60)
            assert result.exit_code == 0, result.output
            snapshot, changes = await handback.changes()
            return [c.path for c in changes], await handback.apply(snapshot, changes)

    offered, outcome = asyncio.run(session())
    assert {".clover/config.toml", ".venv/lib/a.pth", "calculator.py"} <= set(offered)
    assert sorted(outcome.applied) == [".gitignore", "calculator.py"]  # chosen at a terminal: a yes
    assert "never handed back" in outcome.refused[".clover/config.toml"]
    assert "ignored by your tree" in outcome.refused[".venv/lib/a.pth"]
    assert not (repo / ".clover" / "config.toml").exists() and not (repo / ".venv").exists()
    assert FIXED_ADD in (repo / "calculator.py").read_text()
