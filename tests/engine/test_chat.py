"""Chat rendering against the Qwen3.6 golden renderings (byte-exact) and their error cases."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import jinja2
import pytest

from clover_agent.engine.errors import CheckpointError
from clover_agent.engine.text.chat import bundled_chat_template, load_chat_template, render_chat

FIXTURES = Path(__file__).resolve().parent / "fixtures"
#: The shared reference folder, when this checkout sits beside one (the fixture is a copy of it).
SHARED_REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference"
GOLDEN = json.loads((FIXTURES / "qwen3.6-chat-golden.json").read_text())
TEMPLATE = bundled_chat_template()


def _render(inputs: dict) -> str:
    inputs = dict(inputs)
    return render_chat(TEMPLATE, inputs.pop("messages"), **inputs)


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=[c["name"] for c in GOLDEN["cases"]])
def test_golden_rendering_is_byte_exact(case: dict) -> None:
    assert _render(case["inputs"]) == case["rendered"]


@pytest.mark.parametrize("case", GOLDEN["errors"], ids=[c["name"] for c in GOLDEN["errors"]])
def test_golden_error_cases_raise(case: dict) -> None:
    kind, message = case["error"].split(": ", 1)
    expected = {"TemplateError": jinja2.TemplateError, "TypeError": TypeError}[kind]
    with pytest.raises(expected) as info:
        _render(case["inputs"])
    assert str(info.value) == message


@pytest.mark.skipif(not SHARED_REFERENCE.is_dir(), reason="no shared reference folder beside this checkout")
def test_bundled_files_are_the_reference_copies() -> None:
    assert GOLDEN["template"] == "qwen3.6-chat-template.jinja"
    assert (SHARED_REFERENCE / GOLDEN["template"]).read_text() == TEMPLATE
    assert json.loads((SHARED_REFERENCE / "qwen3.6-chat-golden.json").read_text()) == GOLDEN


def test_tojson_keeps_non_ascii_and_html_characters() -> None:
    tool = {"type": "function", "function": {"name": "größe", "description": "a <b> & 'c'"}}
    text = render_chat(TEMPLATE, [{"role": "user", "content": "x"}], tools=[tool])
    assert json.dumps(tool, ensure_ascii=False) in text


def test_none_values_are_dropped_and_reasoning_aliases_apply() -> None:
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "tool_calls": None, "reasoning": "why"},
    ]
    text = render_chat(TEMPLATE, messages)
    assert text.endswith("<|im_start|>assistant\n<think>\nwhy\n</think>\n\na<|im_end|>\n")
    assert "None" not in text
    assert messages[1]["tool_calls"] is None  # the caller's messages are untouched


def test_sandbox_blocks_internals() -> None:
    with pytest.raises(jinja2.exceptions.SecurityError):
        render_chat("{{ messages.__class__.__mro__ }}", [])
    with pytest.raises(jinja2.exceptions.SecurityError):
        render_chat("{% set ns = namespace(_x=1) %}", [])


def test_template_helpers_and_loop_controls() -> None:
    template = (
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}"
        "|{{ strftime_now('%Y') }}"
    )
    rendered = render_chat(template, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    assert rendered == f"a|{datetime.now():%Y}"


def test_load_chat_template_prefers_jinja_file(tmp_path: Path) -> None:
    assert load_chat_template(tmp_path) is None
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "from-config"}))
    assert load_chat_template(tmp_path) == "from-config"
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {"chat_template": [{"name": "tool_use", "template": "t"}, {"name": "default", "template": "d"}]}
        )
    )
    assert load_chat_template(tmp_path) == "d"
    (tmp_path / "chat_template.jinja").write_text("from-file")
    assert load_chat_template(tmp_path) == "from-file"


def test_a_template_that_does_not_compile_names_its_file(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{% if %}"}))
    with pytest.raises(
        CheckpointError, match=f"{tmp_path / 'tokenizer_config.json'}: the chat template does not"
    ):
        load_chat_template(tmp_path)
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0] }")
    with pytest.raises(
        CheckpointError, match=f"{tmp_path / 'chat_template.jinja'}: the chat template does not"
    ):
        load_chat_template(tmp_path)


def test_chat_module_does_not_import_torch() -> None:
    code = "import sys, clover_agent.engine.text.chat; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
