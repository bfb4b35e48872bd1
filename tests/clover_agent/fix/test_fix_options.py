"""What ``fix``'s options imply (a backend's option selects it; options of another backend are
refused, naming the flag), a server checked before any work, and ``clover-agent runs``."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from clover_agent.cli import main
from clover_agent.errors import ExitCode
from tests.clover_agent.fix.test_fix import REPLAY, calculator_repo, run_dirs
from tests.clover_agent.test_backend_openai import ChatServer

pytestmark = pytest.mark.slow


def runs_made(repo: Path) -> list[Path]:
    return run_dirs(repo) if (repo / ".clover" / "runs").is_dir() else []


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed once the block ends: nothing listens there


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--backend", "replay", "--replay", "{replay}", "--model", "/models/clover"],
         "--model is an option of the engine backend, not of --backend replay (which plays the recorded "
         "turns of --replay FILE and runs no model); drop --model, or choose --backend engine"),
        (["--replay", "{replay}", "--base-url", "http://127.0.0.1:9/v1"],
         "--base-url (openai), --replay (replay): these options belong to different backends"),
        (["--backend", "openai", "--replay", "{replay}"],
         "--replay is an option of the replay backend, not of --backend openai"),
    ],
)  # fmt: skip
def test_options_of_another_backend_are_refused_naming_the_flag(
    tmp_path: Path, capsys, flags: list[str], said: str
) -> None:
    repo = calculator_repo(tmp_path)
    code = main(["fix", "test_add", "--repo", str(repo), "--sandbox", "local",
                 *[f.format(replay=REPLAY) for f in flags]])  # fmt: skip
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE and said in err, err
    assert err.count("clover-agent:") == 1 and not runs_made(repo)


def test_base_url_selects_openai_and_an_unreachable_server_stops_before_any_work(
    tmp_path: Path, capsys
) -> None:
    repo = calculator_repo(tmp_path)
    url = f"http://127.0.0.1:{closed_port()}/v1"
    code = main(["fix", "test_add", "--repo", str(repo), "--sandbox", "local", "--base-url", url])
    out, err = capsys.readouterr()
    assert code == ExitCode.MODEL_UNAVAILABLE, err
    assert url.removesuffix("/v1") in err and "engine" not in err  # the server named, not the engine
    assert "tests" not in out and not runs_made(repo)  # no sandbox, no tests: checked first


def test_replay_selects_the_replay_backend_and_runs_lists_and_shows_the_run(tmp_path: Path, capsys) -> None:
    repo = calculator_repo(tmp_path)
    code = main(["fix", "test_add", "--repo", str(repo), "--sandbox", "local", "--replay", str(REPLAY),
                 "--dry-run"])  # fmt: skip
    assert code == ExitCode.OK, capsys.readouterr()
    (run,) = run_dirs(repo)
    capsys.readouterr()

    assert main(["runs", "--repo", str(repo)]) == ExitCode.OK
    header, row = capsys.readouterr().out.splitlines()
    assert header.split() == ["RUN", "TARGET", "RESULT", "CALLS", "BACKEND"]
    assert row.split()[:2] == [run.name, "test_add"] and "fixed (dry run)" in row
    assert row.split()[-2:] == ["5", "replay:calculator-fix.replay.jsonl"]

    assert main(["runs", "show", "last", "--repo", str(repo)]) == ExitCode.OK
    shown = capsys.readouterr().out
    assert f"run {run.name} of {repo}" in shown and "  result      fixed (dry run)" in shown
    patch, transcript = shown.split("\ntranscript\n")
    assert "-    return a - b" in patch and "+    return a + b" in patch
    # The transcript reads as fix showed it: thinking folded to a line, calls, results, figures.
    assert "thinking │ The task names test_add." in transcript
    assert "→ editor command=str_replace" in transcript and "  ✓ " in transcript
    assert "  step 5: " in transcript and "tests target before: 0 passed, 1 failed" in transcript

    assert main(["runs", "show", "nope", "--repo", str(repo)]) == ExitCode.USAGE
    assert f"runs show nope: no such run under {repo / '.clover' / 'runs'}" in capsys.readouterr().err


def test_runs_of_a_repository_without_any(tmp_path: Path, capsys) -> None:
    assert main(["runs", "--repo", str(tmp_path)]) == ExitCode.OK
    assert "no runs under" in capsys.readouterr().out


def test_quiet_leaves_only_the_summary_and_the_hand_back(tmp_path: Path, capsys) -> None:
    repo = calculator_repo(tmp_path)
    code = main(["fix", "test_add", "--repo", str(repo), "--sandbox", "local", "--replay", str(REPLAY),
                 "--dry-run", "-q"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == ExitCode.OK, err
    assert out.lstrip().startswith("clover-agent fix: FIXED") and "Dry run" in out
    assert "→ " not in out and "tests target before" not in out and "thinking" not in out


def test_a_bad_replay_line_stops_before_any_work(tmp_path: Path, capsys) -> None:
    repo = calculator_repo(tmp_path)
    replay = tmp_path / "bad.jsonl"
    replay.write_text('{"content": "fine"}\n{"content": 3}\n')
    code = main(["fix", "test_add", "--repo", str(repo), "--sandbox", "local", "--replay", str(replay)])
    out, err = capsys.readouterr()
    assert code == ExitCode.USAGE and f"{replay}:2: each line must be an object" in err, err
    assert "tests" not in out and not runs_made(repo)


def test_a_model_the_server_does_not_serve_stops_before_any_work(tmp_path: Path, capsys) -> None:
    repo = calculator_repo(tmp_path)
    server = ChatServer()
    server.models = ["clover"]
    try:
        code = main(["fix", "test_add", "--repo", str(repo), "--sandbox", "local", "--base-url",
                     server.base_url, "--model-name", "gpt-4o"])  # fmt: skip
    finally:
        server.close()
    out, err = capsys.readouterr()
    assert code == ExitCode.MODEL_UNAVAILABLE, err
    assert "does not serve the model 'gpt-4o'" in err and "'clover'" in err and "--model-name" in err
    assert "tests" not in out and not runs_made(repo)
    assert [r["path"] for r in server.requests] == ["/v1/models"]  # no chat request, no sandbox
