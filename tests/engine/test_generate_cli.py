"""``clover-agent generate`` on a tiny checkpoint: JSON output, live progress, usage errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clover_agent.cli import main
from clover_agent.engine.engine import Engine
from clover_agent.engine.sampling import SamplingParams
from clover_agent.engine.tiny import write_tiny_checkpoint
from clover_agent.errors import ExitCode


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt", peaked=True, seed=3)


def test_json_output_matches_the_engine(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "generate",
            "--model",
            str(checkpoint),
            "--ids",
            "5,6,7,8",
            "--greedy",
            "--max-new-tokens",
            "24",
            "--json",
        ]
    )
    assert code == ExitCode.OK
    report = json.loads(capsys.readouterr().out)
    expected = Engine.from_pretrained(checkpoint, progress=None).generate(
        [5, 6, 7, 8], SamplingParams.greedy(max_new_tokens=24, thinking=False)
    )
    assert report["token_ids"] == expected.token_ids
    assert report["text"] == expected.text
    assert report["forwards"] == expected.forwards
    assert report["mode"] == "diffusion" and report["tokens"] == len(expected.token_ids)


def test_chat_prompt_streams_progress_to_stderr(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "generate",
            "--model",
            str(checkpoint),
            "--prompt",
            "hello",
            "--chat",
            "--greedy",
            "--mode",
            "self_speculative",
            "--max-new-tokens",
            "12",
        ]
    )
    captured = capsys.readouterr()
    assert code == ExitCode.OK
    assert "tokens/forward" in captured.err and "forwards" in captured.err
    answer = captured.out.rstrip("\n")
    assert answer and answer in captured.err  # the committed text came live on stderr first


def test_usage_errors_exit_2_with_a_message(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["generate", "--model", str(checkpoint), "--ids", "1,x"]) == ExitCode.USAGE
    assert "comma-separated integers" in capsys.readouterr().err
    assert (
        main(["generate", "--model", str(checkpoint), "--ids", "1,2", "--threshold", "2"]) == ExitCode.USAGE
    )
    assert "threshold must be in (0, 1]" in capsys.readouterr().err
    bare = write_tiny_checkpoint(tmp_path / "bare", tokenizer=False)
    assert main(["generate", "--model", str(bare), "--prompt", "hi"]) == ExitCode.USAGE
    assert "no tokenizer.json" in capsys.readouterr().err
