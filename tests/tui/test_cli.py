"""The ``tui`` command line: scripts (no terminal) keep getting help and exit 2."""

from __future__ import annotations

from pathlib import Path

from tests.cli_process import run_cli
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
