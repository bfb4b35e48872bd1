"""``clover-agent model pull`` against an unreachable hub and ``clover-agent model info`` on real
tiny checkpoints written to disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from clover_agent.backends.engine import choose_device
from clover_agent.cli import main
from clover_agent.engine.loading.locate import ModelSources
from clover_agent.engine.loading.tiny import write_tiny_checkpoint
from tests.cli_process import run_cli


def test_pull_says_plainly_when_the_hub_is_unreachable(tmp_path: Path) -> None:
    # Port 9 (discard) on the loopback interface is closed: the connection is refused at once.
    env = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0"}
    proc = run_cli("model", "pull", "--dir", str(tmp_path / "weights"), env=env)
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr
    message = [line for line in proc.stderr.splitlines() if line.startswith("clover-agent:")]
    assert len(message) == 1
    assert "cannot reach the Hugging Face Hub at http://127.0.0.1:9" in message[0]
    assert "Diffuspace/Clover-35B-A3B-Preview" in message[0] and "--model DIR" in message[0]


def test_pull_in_offline_mode_names_the_variable(tmp_path: Path) -> None:
    proc = run_cli("model", "pull", env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr and "HF_HUB_OFFLINE is set" in proc.stderr


def header_totals(model_dir: Path) -> tuple[int, int, list[str]]:
    count = nbytes = 0
    names = []
    for path in model_dir.glob("*.safetensors"):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118
                tensor = handle.get_tensor(name)
                count += tensor.numel()
                nbytes += tensor.numel() * tensor.element_size()
                names.append(name)
    return count, nbytes, names


def test_info_json_describes_a_bidirectional_sharded_checkpoint(tmp_path: Path, capsys) -> None:
    model_dir = write_tiny_checkpoint(
        tmp_path,
        bidirectional=True,
        shards=2,
        dtype=torch.bfloat16,
        prefix="language_model",
        layout="per-expert",
    )
    assert main(["model", "info", str(model_dir), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    count, nbytes, names = header_totals(model_dir)
    assert info["parameters"]["count"] == count and info["parameters"]["bytes"] == nbytes
    assert info["parameters"]["by_dtype"] == {"bfloat16": {"parameters": count, "bytes": nbytes}}
    assert info["parameters"]["files"] == 2 and info["parameters"]["tensors"] == len(names)
    assert info["extra_tensors"] == sorted(n for n in names if "conv1d_right" in n or "bidir_mix" in n)
    assert len(info["extra_tensors"]) == 6
    assert info["layers"]["by_type"] == {"linear_attention": 3, "full_attention": 1}
    assert info["model_type"] == "qwen3_5_moe"
    config = json.loads((model_dir / "config.json").read_text())
    assert info["decoding"] == {
        "mask_token_id": config["mask_token_id"],
        "block_size": 32,
        "threshold": 0.95,
        "eos_token_id": config["eos_token_id"],
        "bidirectional_gdn": True,
    }
    assert info["tokenizer"]["present"] and info["tokenizer"]["mask_token"].endswith("(<|mask|>)")
    # The verdict is the engine backend's: a tiny checkpoint runs (on the CPU without a GPU), as
    # `fix --model DIR` would run it.
    _, fix_device = choose_device(ModelSources(explicit=model_dir))
    assert info["machine"]["can_serve"] is True and info["machine"]["device"] == fix_device
    assert info["machine"]["problems"] == []
    assert info["unknown_tensors"] == [] and info["ignored_tensors"] == []


def test_info_text_for_a_folder_without_tokenizer(tmp_path: Path, capsys) -> None:
    model_dir = write_tiny_checkpoint(tmp_path, tokenizer=False)
    assert main(["model", "info", str(model_dir)]) == 0
    out = capsys.readouterr().out
    count, _, _ = header_totals(model_dir)
    assert f"({count}) in " in out
    assert "float32" in out and "extra tensors: none" in out
    assert "tokenizer:     no (id-level use only)" in out
    assert "layers:        4 (3 linear_attention, 1 full_attention)" in out
    assert "this machine:  can serve it" in out  # as the engine backend would (see choose_device)
    if not torch.cuda.is_available():
        assert "can serve it on the CPU" in out


def test_info_lists_tensors_the_engine_cannot_place(tmp_path: Path, capsys) -> None:
    model_dir = write_tiny_checkpoint(tmp_path, tokenizer=False)
    save_file({"encoder.stray.weight": torch.zeros(2, 2)}, str(model_dir / "stray.safetensors"))
    assert main(["model", "info", str(model_dir)]) == 1
    out = capsys.readouterr().out
    assert "UNKNOWN" in out and "encoder.stray.weight" in out


def test_info_on_a_missing_folder_and_bare_model_command(tmp_path: Path, capsys) -> None:
    assert main(["model", "info", str(tmp_path / "nowhere")]) == 3
    assert "checkpoint folder not found" in capsys.readouterr().err
    (tmp_path / "config.json").write_text("{}")  # the file given instead of its folder
    assert main(["model", "info", str(tmp_path / "config.json")]) == 3
    assert f"{tmp_path / 'config.json'} is a file: give the checkpoint folder" in capsys.readouterr().err
    (tmp_path / "broken").mkdir()
    assert main(["model", "info", str(tmp_path / "broken")]) == 3
    assert "config" in capsys.readouterr().err
    assert main(["model"]) == 2
    assert "pull" in capsys.readouterr().out


@pytest.mark.parametrize("action", ["pull", "info"])
def test_help(action: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["model", action, "--help"])
    assert exit_info.value.code == 0
    expected = {"pull": "about 69 GB", "info": "safetensors headers"}[action]
    assert expected in " ".join(capsys.readouterr().out.split())
