"""The command line: version, help, doctor on this machine, the engine preflight of ``fix``."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clover_agent import __version__
from clover_agent.cli import COMMANDS, build_parser, main
from clover_agent.errors import ExitCode
from tests.cli_process import run_cli

REPO = Path(__file__).resolve().parents[2]


def test_version_and_help(capsys) -> None:
    proc = run_cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"clover-agent {__version__}"
    proc = run_cli("--help")
    assert proc.returncode == 0
    for name in COMMANDS:
        assert name.rsplit(".", 1)[1].replace("_", "-") in proc.stdout


def missing_help(parser: argparse.ArgumentParser) -> list[str]:
    """What ``--help`` leaves unexplained, at every level: a subcommand without a line in its
    parent's listing or without a description, an option or argument without help text
    (``argparse.SUPPRESS``, a deliberately hidden option, counts as explained)."""
    problems = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            listed = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                if not (listed.get(name) or "").strip():
                    problems.append(f"{sub.prog}: no help line in the command listing")
                if not (sub.description or "").strip():
                    problems.append(f"{sub.prog}: no description")
                problems += missing_help(sub)
        elif action.help is not argparse.SUPPRESS and not (action.help or "").strip():
            problems.append(
                f"{parser.prog}: {'/'.join(action.option_strings) or action.dest} has no help text"
            )
    return problems


def test_every_subcommand_and_option_has_help() -> None:
    assert missing_help(build_parser()) == []


def test_missing_help_finds_what_is_unexplained() -> None:
    parser = argparse.ArgumentParser(prog="demo")
    sub = parser.add_subparsers(dest="command")
    bare = sub.add_parser("bare")
    bare.add_argument("--flag", action="store_true")
    bare.add_argument("path")
    bare.add_argument("--hidden", help=argparse.SUPPRESS)
    nested = sub.add_parser("outer", help="has a line", description="has a description")
    nested.add_subparsers().add_parser("inner", help="listed")
    assert missing_help(parser) == [
        "demo bare: no help line in the command listing",
        "demo bare: no description",
        "demo bare: --flag has no help text",
        "demo bare: path has no help text",
        "demo outer inner: no description",
    ]


@pytest.mark.slow  # CLI processes that load torch (10-80 s in a 2-worker run)
def test_doctor_json_names_missing_gpu_and_weights(tmp_path: Path) -> None:
    import torch

    env = {"HF_HOME": str(tmp_path / "hf"), "CLOVER_CONFIG": str(tmp_path / "none.toml")}
    env.pop("CLOVER_MODEL", None)
    proc = run_cli("doctor", "--json", env={**env, "CLOVER_MODEL": ""})
    report = json.loads(proc.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["python"]["ok"]
    assert not checks["weights"]["ok"]
    assert str(tmp_path / "hf") in checks["weights"]["detail"]
    assert "embedded engine" in checks["weights"]["blocks"]
    if not torch.cuda.is_available():
        assert not checks["gpu"]["ok"]
        assert "engine" in checks["gpu"]["blocks"]
    assert report["ready"] is False
    assert proc.returncode == ExitCode.FAILURE


@pytest.mark.slow  # CLI processes that load torch (10-80 s in a 2-worker run)
def test_doctor_finds_weights_from_env(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0" * 16)
    proc = run_cli("doctor", "--json", env={"CLOVER_MODEL": str(model)})
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["weights"]["ok"]
    assert str(model) in checks["weights"]["detail"]


@pytest.fixture
def no_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No Clover weights anywhere the lookup goes: plans use the published config."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("CLOVER_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.delenv("CLOVER_MODEL", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)


def test_doctor_plans_int4_on_a_24_gib_card_without_a_gpu(no_weights: None, capsys) -> None:
    assert main(["doctor", "--plan", "--card-gib", "24", "--experts", "int4"]) == ExitCode.OK
    out = capsys.readouterr().out
    assert out.startswith("memory plan: 24.00 GiB card, routed experts int4, context 32,768 tokens")
    assert "Clover-35B-A3B's published config" in out
    assert "fits: 1 request(s) at 32,768 tokens" in out


def test_doctor_plan_that_does_not_fit_names_what_would(no_weights: None, capsys) -> None:
    code = main(["doctor", "--plan", "--card-gib", "24", "--experts", "bf16", "--context", "16384", "--json"])
    assert code == ExitCode.FAILURE
    report = json.loads(capsys.readouterr().out)
    plan = report["memory_plan"]
    assert plan["fits"] is False and plan["experts"] == "bf16" and plan["context_tokens"] == 16384
    assert any(s.startswith("INT4 experts (--experts int4): fits with") for s in plan["suggestions"])
    assert main(["doctor", "--plan", "--card-gib", "16"]) == ExitCode.FAILURE
    assert "routed experts in host memory (--experts-on host" in capsys.readouterr().out
    code = main(
        ["doctor", "--plan", "--card-gib", "16", "--experts", "int4", "--experts-on", "host", "--json"]
    )
    assert code == ExitCode.OK
    planned = json.loads(capsys.readouterr().out)["memory_plan"]
    assert planned["host_experts"] is True and planned["fits"] is True
    assert planned["weights"]["routed experts"] == 0


def test_doctor_checks_include_the_plan_for_the_card(no_weights: None, capsys) -> None:
    main(["doctor", "--card-gib", "24", "--json"])
    report = json.loads(capsys.readouterr().out)
    checks = {c["name"]: c for c in report["checks"]}
    assert {"python", "torch", "gpu", "weights", "docker"} <= set(checks)  # the checks stay
    plan = checks["memory-plan"]
    assert not plan["ok"] and not plan["required"]
    assert plan["detail"].startswith(
        "24.0 GiB card: does not fit; INT4 experts (--experts int4): fits with 1 request(s)"
    )
    assert report["memory_plan"]["experts"] == "bf16" and report["memory_plan"]["fits"] is False


def test_doctor_plans_the_weights_it_finds(tmp_path: Path, capsys) -> None:
    from clover_agent.engine.loading.tiny import write_tiny_checkpoint
    from clover_agent.engine.memory_plan import weight_bytes
    from clover_agent.engine.model.config import CloverConfig

    model = write_tiny_checkpoint(tmp_path / "tiny", tokenizer=False)
    code = main(
        ["doctor", "--plan", "--model", str(model), "--card-gib", "4", "--max-running", "3", "--json"]
    )
    assert code == ExitCode.OK
    plan = json.loads(capsys.readouterr().out)["memory_plan"]
    config = CloverConfig.from_file(model)
    assert plan["weights"] == weight_bytes(config, "bf16") and plan["max_running"] == 3
    assert plan["context_tokens"] == config.max_position_embeddings  # shorter than 32k


def test_doctor_plan_needs_a_card(no_weights: None, capsys) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the plan is for it")
    assert main(["doctor", "--plan"]) == ExitCode.FAILURE
    out = capsys.readouterr().out
    assert "no CUDA GPU here" in out and "plan for a card with --card-gib N" in out
    with pytest.raises(SystemExit):
        main(["doctor", "--plan", "--card-gib", "0"])


def test_doctor_plan_past_the_context_window_says_so(no_weights: None, capsys) -> None:
    assert main(["doctor", "--plan", "--card-gib", "80", "--context", "200000"]) == ExitCode.FAILURE
    assert "past the model's window of 131,072" in capsys.readouterr().out


def test_fix_with_engine_stops_fast_with_ways_forward(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        import pytest

        pytest.skip("this machine has a GPU: the engine preflight does not stop here")
    start = time.monotonic()
    proc = run_cli(
        "fix",
        "test_add",
        "--repo",
        str(REPO / "examples" / "calculator"),
        env={"HF_HOME": str(tmp_path / "hf"), "CLOVER_MODEL": ""},
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == ExitCode.MODEL_UNAVAILABLE, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "no CUDA GPU" in proc.stderr
    assert "no Clover weights found" in proc.stderr
    assert "--backend openai --base-url" in proc.stderr
    assert elapsed < 120  # the preflight stops it before any sandbox or test run, let alone a load


def test_main_returns_usage_without_command(capsys) -> None:
    assert main([]) == ExitCode.USAGE


@pytest.mark.slow  # CLI processes that load torch (10-80 s in a 2-worker run)
def test_a_reader_leaving_early_gets_no_traceback() -> None:
    """`clover-agent doctor --json | head -1`: the pipe closes before the output is written."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "clover_agent", "doctor", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()  # the reader is gone before the report is printed
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == ExitCode.FAILURE
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_fix_refuses_budgets_of_zero_or_less_up_front(capsys) -> None:
    for option, value in [
        ("--max-steps", "0"),
        ("--max-time", "-5"),
        ("--max-time", "nan"),
        ("--max-tokens", "0"),
    ]:
        with pytest.raises(SystemExit) as stop:
            main(["fix", "test_add", "--repo", str(REPO / "examples" / "calculator"), option, value])
        assert stop.value.code == ExitCode.USAGE
        assert f"argument {option}: must be above 0 (got {value})" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["fix", "test_add", "--max-steps", "many"])
    assert "argument --max-steps: invalid int value: 'many'" in capsys.readouterr().err


def test_fix_help_says_what_each_policy_allows(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # no line breaks inside `read-only`
    with pytest.raises(SystemExit):
        main(["fix", "--help"])
    policy_help = " ".join(capsys.readouterr().out.split("--policy {read-only,workspace,ci}")[-1].split())
    assert "(default workspace)" in policy_help
    for name in ("read-only:", "workspace:", "ci:"):
        assert name in policy_help


def test_fix_help_says_where_the_api_key_comes_from(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit):
        main(["fix", "--help"])
    (base_url_help,) = [line for line in capsys.readouterr().out.splitlines() if "--base-url URL " in line]
    assert "CLOVER_BASE_URL" in base_url_help and "CLOVER_API_KEY or OPENAI_API_KEY" in base_url_help


def test_top_level_help_lists_the_exit_codes(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user with only the installed command (no README at hand) can read what an exit code means."""
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "0 ok, 1 failure, 2 usage, 3 model unavailable, 4 sandbox unavailable, 5 nothing to fix" in out
    assert "6 budget exhausted, 7 agent error, 8 suite unverified, 9 needs review, 10 blocked" in out
    assert "130 interrupted" in out


@pytest.mark.docker
def test_doctor_says_how_to_build_a_missing_sandbox_image(tmp_path: Path) -> None:
    image = "clover-agent-test-no-such-image:never"
    proc = run_cli(
        "doctor", env={"CLOVER_SANDBOX_IMAGE": image, "CLOVER_CONFIG": str(tmp_path / "none.toml")}
    )
    line = next(line for line in proc.stdout.splitlines() if "sandbox-image" in line)
    assert line.startswith("[MISS]") and f"{image} is not on this Docker engine" in line
    # The command builds this very tag; --base is the option for building FROM a local image.
    assert f"`clover-agent sandbox build --tag {image}`" in line and "--base IMAGE" in line
    assert proc.returncode == ExitCode.FAILURE
