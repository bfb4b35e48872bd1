"""User settings: the config file's values, and a broken file explained instead of a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from clover_agent.errors import ExitCode, UsageError
from clover_agent.settings import DEFAULT_SANDBOX_IMAGE, Settings
from tests.cli_process import run_cli


def write_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    monkeypatch.setenv("CLOVER_CONFIG", str(path))
    for name in ("CLOVER_SANDBOX_IMAGE", "CLOVER_BASE_URL", "CLOVER_HOME"):
        monkeypatch.delenv(name, raising=False)
    return path


def test_values_come_from_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(
        tmp_path,
        monkeypatch,
        'home = "/srv/clover"\n[model]\npath = "/models/clover"\n[sandbox]\nimage = "mine:1"\n'
        '[openai]\nbase_url = "http://gpu:30000/v1"\n',
    )
    settings = Settings.load()
    assert (settings.home, settings.model_path) == (Path("/srv/clover"), "/models/clover")
    assert (settings.sandbox_image, settings.base_url) == ("mine:1", "http://gpu:30000/v1")
    monkeypatch.setenv("CLOVER_SANDBOX_IMAGE", "env:2")  # the environment wins
    assert Settings.load().sandbox_image == "env:2"


def test_an_empty_file_gives_the_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(tmp_path, monkeypatch, "")
    settings = Settings.load()
    assert settings.sandbox_image == DEFAULT_SANDBOX_IMAGE and settings.model_path is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("image = = 1\n", "not a readable TOML file (Invalid value"),
        ("[sandbox]\nimage = 5\n", "[sandbox] image must be a string (got 5)"),
        ("sandbox = 5\n", "sandbox must be a table ([sandbox])"),
        ("home = true\n", "home must be a string (got True)"),
    ],
)
def test_a_broken_file_is_named_with_what_is_wrong(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, message: str
) -> None:
    path = write_config(tmp_path, monkeypatch, text)
    with pytest.raises(UsageError) as error:
        Settings.load()
    assert error.value.message.startswith(f"{path}: {message}")


def test_commands_report_a_broken_file_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[sandbox]\nimage = 5\n")
    done = run_cli("doctor", env={"CLOVER_CONFIG": str(path)})
    assert done.returncode == ExitCode.USAGE
    assert done.stderr == f"clover-agent: {path}: [sandbox] image must be a string (got 5)\n"
