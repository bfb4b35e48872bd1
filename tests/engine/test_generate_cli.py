"""``clover-agent generate`` on a tiny checkpoint: JSON output, live progress, usage errors."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from clover_agent.cli import main
from clover_agent.engine.decoding.sampling import SamplingParams
from clover_agent.engine.engine import Engine
from clover_agent.engine.loading.tiny import write_tiny_checkpoint
from clover_agent.engine.text.tokenizer import load_tokenizer
from clover_agent.errors import ExitCode
from tests.cli_process import run_at_a_terminal, run_cli, start_signalable


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


def test_bad_arguments_are_found_before_the_weights_load(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Loading Clover itself takes minutes: arguments wrong on their face fail first. Here there
    are no weights at all, so anything that tried to load them would exit 3 instead."""
    weightless = tmp_path / "weightless"
    shutil.copytree(checkpoint, weightless)
    for tensors in weightless.glob("*.safetensors"):
        tensors.unlink()
    for args, message in [
        (["--ids", "1,x"], "comma-separated integers"),
        (["--ids", "1,2", "--threshold", "2"], "threshold must be in (0, 1]"),
        (["--ids", "1,2", "--max-new-tokens", "0"], "at least 1"),
        (["--prompt", "hi", "--threshold", "0"], "threshold must be in (0, 1]"),
    ]:
        assert main(["generate", "--model", str(weightless), *args]) == ExitCode.USAGE, args
        err = capsys.readouterr().err
        assert message in err and "loading weights" not in err, (args, err)
    assert main(["generate", "--model", str(weightless), "--ids", "1,2"]) == ExitCode.MODEL_UNAVAILABLE


@pytest.mark.slow  # CLI processes that load torch (10-80 s in a 2-worker run)
def test_user_errors_are_messages_with_their_exit_code_never_tracebacks(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through the command as a user runs it: one line on stderr, the documented exit code."""
    templateless = tmp_path / "templateless"
    shutil.copytree(checkpoint, templateless)
    (templateless / "chat_template.jinja").unlink()
    config = json.loads((templateless / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (templateless / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_tokenizer(templateless).chat_template is None
    in_subprocess = [
        (["--model", str(templateless), "--prompt", "hi", "--chat"], ExitCode.USAGE, "no chat template"),
        (
            ["--model", str(checkpoint), "--ids", "1,2", "--device", "gpu0"],
            ExitCode.USAGE,
            "not a torch device",
        ),
    ]
    for args, code, message in in_subprocess:
        done = run_cli("generate", *args)
        assert "Traceback" not in done.stderr, args
        assert (done.returncode, message in done.stderr) == (code, True), (args, done.stderr)
        # loading progress may come first; the error is one line at the end
        assert done.stderr.splitlines()[-1].startswith("clover-agent: ") and done.stdout == ""
    in_process = [
        (["--model", str(checkpoint), "--ids", "1,2", "--max-new-tokens", "0"], ExitCode.USAGE, "at least 1"),
        (["--model", str(checkpoint), "--ids", ","], ExitCode.USAGE, "prompt is empty"),
        (["--model", str(checkpoint), "--ids", "1", "--thinking"], ExitCode.USAGE, "--thinking needs --chat"),
        (["--model", str(tmp_path / "missing"), "--ids", "1"], ExitCode.MODEL_UNAVAILABLE, "not found"),
    ]
    for args, code, message in in_process:
        assert main(["generate", *args]) == code, args
        assert message in capsys.readouterr().err, args


def test_block_size_and_threshold_come_from_the_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_tiny_checkpoint(
        tmp_path / "b16", peaked=True, tokenizer=False, overrides={"block_size": 16, "threshold": 1.0}
    )
    args = [
        "generate",
        "--model",
        str(folder),
        "--ids",
        "5,6,7",
        "--greedy",
        "--max-new-tokens",
        "20",
        "--json",
    ]
    assert main(args) == ExitCode.OK
    report = json.loads(capsys.readouterr().out)
    # threshold 1.0: every pass fills one position; block 16: the first block has 13 slots
    assert report["fallback_rate"] == 1.0
    assert report["steps_per_block"][0] == 13 or report["finish_reason"] == "stop"


def test_sampling_uses_the_coding_preset_and_greedy_is_one_flag_away(
    checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(*flags: str) -> dict:
        args = [
            "generate",
            "--model",
            str(checkpoint),
            "--ids",
            "5,6,7,8",
            "--max-new-tokens",
            "40",
            "--json",
        ]
        assert main([*args, *flags]) == ExitCode.OK
        return json.loads(capsys.readouterr().out)

    engine = Engine.from_pretrained(checkpoint, progress=None)
    sampled = run()
    coding = SamplingParams.coding(engine.config, max_new_tokens=40, thinking=False)
    assert {name: sampled["params"][name] for name in ("temperature", "top_p", "top_k")} == {
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
    }
    assert sampled["params"] == json.loads(json.dumps(dataclasses.asdict(coding)))
    # The reported parameters are the ones that decoded: the engine with them draws the same tokens.
    assert sampled["token_ids"] == engine.generate([5, 6, 7, 8], coding).token_ids
    other_seed = run("--seed", "1")
    assert other_seed["params"]["seed"] == 1
    assert other_seed["token_ids"] == engine.generate([5, 6, 7, 8], coding.with_changes(seed=1)).token_ids
    # --greedy: the same preset with greedy draws, nothing else changed.
    greedy = run("--greedy")
    assert greedy["params"] == sampled["params"] | {"temperature": 0.0, "top_p": 1.0, "top_k": 0}
    greedy_params = SamplingParams.greedy(engine.config, max_new_tokens=40, thinking=False)
    assert greedy["token_ids"] == engine.generate([5, 6, 7, 8], greedy_params).token_ids
    # Sampling at temperature 0.6 is not greedy decoding in disguise on this checkpoint.
    assert greedy["token_ids"] not in (sampled["token_ids"], other_seed["token_ids"])


def test_help_claims_greedy_equality_only_with_greedy(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --greedy, generate samples (temperature 0.6): self_speculative then equals
    autoregressive sampling in distribution, not greedy decoding."""
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    mode_help = capsys.readouterr().out.split("--mode {diffusion,self_speculative,autoregressive}")[-1]
    assert "with --greedy the output equals greedy autoregressive decoding" in mode_help


@pytest.mark.slow
def test_ctrl_c_ends_the_partial_line_before_interrupted(checkpoint: Path) -> None:
    """SIGINT while text streams: "clover-agent: interrupted" is a line of its own, exit 130."""
    command = [sys.executable, "-m", "clover_agent", "generate", "--model", str(checkpoint)]
    command += ["--ids", "5,6,7,8", "--greedy", "--max-new-tokens", "2000"]
    child = start_signalable(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stderr is not None
    seen = b""
    try:
        # Past the weight-loading report, wait for committed text that has not ended its line.
        while not (b"ETA" in seen and b"\n" in seen.split(b"ETA")[-1] and not seen.endswith(b"\n")):
            chunk = os.read(child.stderr.fileno(), 4096)
            assert chunk, f"generate ended before streaming text: {seen!r}"
            seen += chunk
        child.send_signal(signal.SIGINT)
        _, rest = child.communicate(timeout=60)
    finally:
        child.kill()
    stderr = (seen + rest).decode(errors="replace")
    assert child.returncode == ExitCode.INTERRUPTED
    assert stderr.splitlines()[-1] == "clover-agent: interrupted", stderr[-300:]
    assert "Traceback" not in stderr


@pytest.mark.slow  # CLI processes that load torch (10-80 s in a 2-worker run)
def test_at_a_terminal_the_answer_is_shown_once_with_its_rates(checkpoint: Path) -> None:
    args = ["generate", "--model", str(checkpoint), "--prompt", "hello", "--greedy", "--max-new-tokens", "40"]
    piped = run_cli(*args, "--json")
    report = json.loads(piped.stdout)
    assert report["tokens_per_second"] > 0 and 0 < report["first_block_seconds"] <= report["seconds"]
    answer = report["text"].strip()
    assert len(answer) >= 8, report
    code, shown = run_at_a_terminal(args)
    assert code == ExitCode.OK, shown
    assert shown.count(answer) == 1, shown  # streamed to the terminal, not printed again
    assert "tokens/s" in shown and "first block after" in shown
    # Piped, stdout gets the answer once and stderr the live copy (progress): one each.
    piped = run_cli(*args)
    assert piped.stdout.strip() == answer and piped.stderr.count(answer) == 1


@pytest.mark.slow  # CLI processes that load torch (10-80 s in a 2-worker run)
def test_device_auto_is_the_cpu_without_a_gpu(checkpoint: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible here: auto is cuda")
    done = run_cli(
        "generate", "--model", str(checkpoint), "--ids", "5,6,7", "--max-new-tokens", "4", "--json"
    )
    assert done.returncode == ExitCode.OK, done.stderr
    assert (
        "--device" in run_cli("generate", "--help").stdout and "auto" in run_cli("generate", "--help").stdout
    )
