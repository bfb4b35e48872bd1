"""The ``tui`` command line: scripts (no terminal) keep getting help and exit 2; a deleted current
folder is a usage error for ``tui`` and ``fix``, not a traceback; what would fail once the app is
up (a bad replay file, an unreachable server, Docker not answering) is said before it draws."""

from __future__ import annotations

import os
import pty
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_process import run_at_a_terminal, run_cli
from tests.tui.helpers import calculator_repo


def test_plain_clover_agent_without_a_terminal_prints_help_and_exits_2() -> None:
    result = run_cli()
    assert result.returncode == 2
    assert "usage: clover-agent" in result.stdout and "tui" in result.stdout


def test_tui_without_a_terminal_is_a_usage_error(tmp_path: Path) -> None:
    result = run_cli("tui", "--repo", str(calculator_repo(tmp_path)), "--backend", "replay", "--replay", "x")
    assert result.returncode == 2
    assert "the TUI needs a terminal" in result.stderr
    assert "Traceback" not in result.stderr


def test_tui_help_lists_the_options_fix_has() -> None:
    result = run_cli("tui", "--help")
    assert result.returncode == 0
    for option in ("--resume", "--backend", "--replay", "--sandbox", "--image", "--policy", "--max-steps"):
        assert option in result.stdout


def test_the_readme_lists_every_key_and_command() -> None:
    from clover_agent.tui.keys import COMMANDS, KEYS

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for key in KEYS:
        assert f"| `{key.keys.replace(',', '` / `')}` | {key.where} | {key.description} |" in readme, key
    for command in COMMANDS:
        assert f"| `{command.usage}` | {command.description} |" in readme, command


def _in_a_deleted_folder(tmp_path: Path, args: list[str], *, terminal: bool) -> tuple[int, str]:
    """``clover-agent ARGS`` run from a shell whose current folder was deleted (stdin and stdout on a
    pseudo-terminal when ``terminal``, as the TUI needs); its exit code and all it printed."""
    gone = tmp_path / "gone"
    gone.mkdir()
    cli = Path(sys.executable).with_name("clover-agent")
    script = f"cd {shlex.quote(str(gone))} && rmdir {shlex.quote(str(gone))} && exec {shlex.join([str(cli), *args])}"
    if not terminal:
        done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=120)
        return done.returncode, done.stdout + done.stderr
    main_fd, terminal_fd = pty.openpty()
    child = subprocess.Popen(["sh", "-c", script], stdin=terminal_fd, stdout=terminal_fd, stderr=terminal_fd)
    os.close(terminal_fd)
    shown = b""
    while True:
        try:
            chunk = os.read(main_fd, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(main_fd)
    return child.wait(timeout=120), shown.decode(errors="replace")


@pytest.mark.parametrize("command", ["tui", "fix"])
def test_a_deleted_current_folder_is_a_clear_error(tmp_path: Path, command: str) -> None:
    replay = tmp_path / "r.jsonl"
    replay.write_text('{"content": "hi"}\n')
    args = [command, *(["the failing test"] if command == "fix" else []), "--backend", "replay"]
    code, shown = _in_a_deleted_folder(tmp_path, [*args, "--replay", str(replay)], terminal=command == "tui")
    assert code == 2, shown
    assert "the current folder no longer exists" in shown
    assert "Traceback" not in shown and "FileNotFoundError" not in shown


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize(
    ("case", "code", "said"),
    [
        ("a bad replay line", 2, "not valid JSON"),
        ("an unreachable server", 3, "127.0.0.1"),
        ("Docker not answering", 4, "Docker"),
    ],
)
def test_start_up_checks_before_the_app_draws(tmp_path: Path, case: str, code: int, said: str) -> None:
    """As ``fix`` does: each is a clear error at the shell, and the app never draws."""
    repo = calculator_repo(tmp_path)
    replay = tmp_path / "r.jsonl"
    replay.write_text('{"content": "fine"}\n' + ('{"content": ' if case == "a bad replay line" else ""))
    args = ["tui", "--sandbox", "docker" if case == "Docker not answering" else "local"]
    env = {}
    if case == "an unreachable server":
        args += ["--backend", "openai", "--base-url", f"http://127.0.0.1:{_closed_port()}/v1"]
    else:
        args += ["--backend", "replay", "--replay", str(replay)]
    if case == "Docker not answering":
        env["DOCKER_HOST"] = f"unix://{tmp_path / 'no-docker.sock'}"
    exit_code, shown = run_at_a_terminal(args, env=env, cwd=repo, timeout=120)
    assert exit_code == code, shown
    assert said in shown and "Traceback" not in shown
    assert "Ask for a change" not in shown  # the app did not start
