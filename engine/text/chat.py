"""Rendering a conversation with the model's own Jinja chat template.

The environment reproduces the one Hugging Face ``transformers`` uses for ``apply_chat_template``,
because checkpoints' templates are written (and their renderings trained) against it: a sandboxed,
immutable environment with ``trim_blocks`` and ``lstrip_blocks``, the loop-controls extension, a
``tojson`` filter that is ``json.dumps(ensure_ascii=False)`` (Jinja's own one escapes HTML
characters), and the globals ``raise_exception`` (a :class:`jinja2.TemplateError`) and
``strftime_now``. Messages are normalised the same way: keys whose value is ``None`` are dropped and
reasoning passed as ``thinking`` or ``reasoning`` is also offered as ``reasoning_content``.

Pure Python on purpose (no torch): the agent's protocol module renders prompts with it.
Errors raised by a template (``raise_exception``) or by Jinja filters propagate unchanged.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from clover_agent.engine.errors import CheckpointError

#: File name of the template in a checkpoint folder (preferred over ``tokenizer_config.json``).
CHAT_TEMPLATE_FILE = "chat_template.jinja"
#: The Qwen3.6 template shipped with this package (a copy of the published one).
BUNDLED_TEMPLATE = "qwen3.6-chat-template.jinja"
#: Other names a message's reasoning may arrive under; the first is what templates read.
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _SafeNamespace(jinja2.utils.Namespace):
    """``namespace()`` that refuses underscore-prefixed attribute names (no reach into internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # same signature trick as Jinja's Namespace
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _SafeNamespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _SafeNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a chat template cannot set {name!r} on a namespace")


@functools.lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """Compile a chat template in the transformers-equivalent environment (cached by source)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _SafeNamespace
    return env.from_string(source)


def _plain(value: Any) -> Any:
    """A fresh copy made of plain JSON types, so the template never sees (or touches) caller objects."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    return f"<{type(value).__name__}>"


def _normalise_message(message: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        raise TypeError(f"chat messages must be dicts, got {message!r}")
    out = {key: _plain(value) for key, value in message.items() if value is not None}
    reasoning = next((out[key] for key in _REASONING_KEYS if key in out), None)
    if reasoning is not None:
        out = {"thinking": reasoning, **out, "reasoning_content": reasoning}
    return out


def render_chat(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    enable_thinking: bool | None = None,
    **kwargs: Any,
) -> str:
    """Render ``messages`` (OpenAI-style dicts) with ``template``.

    ``tools`` are JSON-schema tool specs. ``enable_thinking=None`` leaves the variable undefined,
    so the template's own default applies (Qwen3.6: thinking on). Extra keyword arguments become
    template variables (e.g. ``preserve_thinking=True``).
    """
    variables: dict[str, Any] = {key: _plain(value) for key, value in kwargs.items()}
    if enable_thinking is not None:
        variables["enable_thinking"] = bool(enable_thinking)
    return compile_template(template).render(
        messages=[_normalise_message(m) for m in messages],
        tools=_plain(list(tools)) if tools is not None else None,
        add_generation_prompt=add_generation_prompt,
        **variables,
    )


def load_chat_template(model_dir: str | Path) -> str | None:
    """The chat template of a checkpoint folder: ``chat_template.jinja``, else the ``chat_template``
    entry of ``tokenizer_config.json`` (a string, or a list of named templates: ``default`` wins);
    None when the folder has neither."""
    model_dir = Path(model_dir)
    jinja_file = model_dir / CHAT_TEMPLATE_FILE
    if jinja_file.is_file():
        return _compiling(jinja_file.read_text(encoding="utf-8"), jinja_file)
    config_file = model_dir / "tokenizer_config.json"
    if not config_file.is_file():
        return None
    entry = json.loads(config_file.read_text(encoding="utf-8")).get("chat_template")
    if isinstance(entry, list):
        named = {item.get("name"): item.get("template") for item in entry if isinstance(item, Mapping)}
        entry = named.get("default") or next(iter(named.values()), None)
    return _compiling(entry, config_file) if isinstance(entry, str) else None


def _compiling(source: str, origin: Path) -> str:
    """``source``, once it compiles: a broken template is the checkpoint's fault, named with its file."""
    try:
        compile_template(source)
    except jinja2.TemplateSyntaxError as exc:
        raise CheckpointError(
            f"{origin}: the chat template does not compile: {exc.message} (line {exc.lineno})"
        ) from exc
    return source


def bundled_chat_template() -> str:
    """The Qwen3.6 chat template shipped with the package (what the tiny checkpoint writer uses)."""
    return (
        resources.files("clover_agent.engine.text")
        .joinpath("templates", BUNDLED_TEMPLATE)
        .read_text(encoding="utf-8")
    )
