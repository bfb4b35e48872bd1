"""``clover-agent tool`` as a user runs it: a subprocess over a real repository."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_process import run_cli
from tests.git_repos import make_repo


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``root`` with its content and mtime, to prove the tool never touched it."""
    return {
        p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "proj", {"app.py": "def greet():\n    return 'helo'\n"})


def test_edit_prints_result_and_diff_and_leaves_the_folder_alone(project: Path) -> None:
    before = snapshot(project)
    args = {"command": "str_replace", "path": "/workspace/app.py", "old_str": "'helo'", "new_str": "'hello'"}
    done = run_cli("tool", "editor", json.dumps(args), "--sandbox", "local", "--workdir", str(project))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("The file /workspace/app.py has been edited.")
    assert f"--- changes made in the sandbox's copy ({project} itself is unchanged) ---" in done.stdout
    assert "-    return 'helo'\n+    return 'hello'" in done.stdout
    assert snapshot(project) == before


def test_json_output_and_tool_error_exit_code(project: Path) -> None:
    done = run_cli(
        "tool",
        "shell",
        '{"command": "echo hi; exit 7"}',
        "--sandbox",
        "local",
        "--workdir",
        str(project),
        "--json",
    )
    assert done.returncode == 1
    payload = json.loads(done.stdout)
    assert payload["ok"] is False and payload["data"]["exit_code"] == 7
    assert payload["output"] == "hi\n[exit code: 7]" and payload["diff"] == ""
    refused = run_cli(
        "tool",
        "editor",
        '{"command": "view", "path": "/etc/passwd"}',
        "--sandbox",
        "local",
        "--workdir",
        str(project),
    )
    assert refused.returncode == 1 and "outside the workspace" in refused.stdout


def test_usage_errors_exit_2(project: Path) -> None:
    bad_json = run_cli("tool", "shell", "{nope", "--sandbox", "local", "--workdir", str(project))
    assert bad_json.returncode == 2 and "ARGS is not valid JSON" in bad_json.stderr
    unknown = run_cli("tool", "browser", "{}", "--sandbox", "local", "--workdir", str(project))
    assert unknown.returncode == 2 and "invalid choice" in unknown.stderr
    no_dir = run_cli(
        "tool", "shell", '{"command": "true"}', "--sandbox", "local", "--workdir", str(project / "missing")
    )
    assert no_dir.returncode == 2 and "is not a folder" in no_dir.stderr


def test_docker_unreachable_exit_4(project: Path) -> None:
    done = run_cli(
        "tool",
        "shell",
        '{"command": "true"}',
        "--sandbox",
        "docker",
        "--workdir",
        str(project),
        env={"DOCKER_HOST": "unix:///nonexistent/clover-test.sock"},
    )
    assert done.returncode == 4, done.stderr
    assert done.stderr.startswith("clover-agent: ") and "Traceback" not in done.stderr
    assert "no Docker engine answers at unix:///nonexistent/clover-test.sock" in done.stderr
    assert "--sandbox local" in done.stderr  # the way out is named


def test_sandbox_dying_mid_call_is_one_clear_message_exit_4(project: Path) -> None:
    done = run_cli(
        "tool",
        "shell",
        '{"command": "kill -9 $PPID; sleep 30"}',
        "--sandbox",
        "local",
        "--workdir",
        str(project),
    )
    assert done.returncode == 4, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("clover-agent: the sandbox stopped working during the shell call: "), done.stderr
    assert done.stdout == ""


@pytest.mark.docker
def test_docker_call(project: Path) -> None:
    before = snapshot(project)
    done = run_cli(
        "tool",
        "shell",
        '{"command": "id -u; pwd; echo x >> app.py"}',
        "--sandbox",
        "docker",
        "--workdir",
        str(project),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("1000\n/workspace\n[exit code: 0]")
    assert "+x" in done.stdout
    assert snapshot(project) == before
