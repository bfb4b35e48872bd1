"""The checkpoint's tokenizer: ``tokenizer.json`` through ``tokenizers``, plus what
``tokenizer_config.json`` adds (the eos token, the chat template).

A checkpoint folder without ``tokenizer.json`` still loads for id-level use: :func:`load_tokenizer`
returns None and only text-level APIs are unavailable.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as BackendTokenizer

from clover_agent.engine.errors import CheckpointError
from clover_agent.engine.text.chat import load_chat_template, render_chat

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"


class Tokenizer:
    """Text <-> ids for one checkpoint, with its special tokens and chat template."""

    def __init__(
        self,
        backend: BackendTokenizer,
        *,
        eos_token: str | None = None,
        chat_template: str | None = None,
    ) -> None:
        self.backend = backend
        self.chat_template = chat_template
        #: Held across setting the backend's ``encode_special_tokens`` and the encode that reads it:
        #: the setting is shared, and encodes run without the GIL, so threads would take each other's.
        self._encoding = threading.Lock()
        self._added = {
            token.content: token_id for token_id, token in backend.get_added_tokens_decoder().items()
        }
        #: The text of every added token, special or not (``<|im_end|>``, and ``</tool_response>``,
        #: ``<think>``, ``<tool_call>`` ...): text the tokenizer reads as one marker token wherever it
        #: appears, so untrusted text holding it must be defused before it is rendered into a prompt.
        self.marker_texts: tuple[str, ...] = tuple(sorted(self._added, key=len, reverse=True))
        self.special_ids: frozenset[int] = frozenset(
            token_id for token_id, token in backend.get_added_tokens_decoder().items() if token.special
        )
        #: Id of the configured eos token (``tokenizer_config.json``), else of ``<|endoftext|>``.
        self.eos_id: int | None = (
            self.maybe_token_id(eos_token) if eos_token else self.maybe_token_id("<|endoftext|>")
        )
        self.im_start_id: int | None = self.maybe_token_id(IM_START)
        self.im_end_id: int | None = self.maybe_token_id(IM_END)

    @classmethod
    def from_file(
        cls, path: str | Path, *, eos_token: str | None = None, chat_template: str | None = None
    ) -> Tokenizer:
        path = Path(path)
        try:
            backend = BackendTokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on malformed files
            raise ValueError(f"cannot read tokenizer file {path}: {exc}") from exc
        return cls(backend, eos_token=eos_token, chat_template=chat_template)

    @cached_property
    def longest_token_chars(self) -> int:
        """The most characters one token writes: a text of n characters takes at least n / this
        many tokens (``serve`` refuses a prompt that cannot fit its window without tokenising it)."""
        return max(len(self.decode([token_id])) for token_id in range(self.vocab_size))

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer knows (BPE plus added tokens); the model may have more rows."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, special_tokens: bool = True) -> list[int]:
        """Ids of ``text``. With ``special_tokens=False`` special-token text (``<|im_end|>``...) is
        encoded as plain characters, which is what untrusted text (tool output) should get; added
        tokens that are not special (``<think>``, ``<tool_call>``) are matched either way. Other
        Python threads run meanwhile (``tokenizers``' ``encode`` holds the GIL, its batch does not):
        a long prompt tokenised in a worker thread must not stop ``serve``'s event loop."""
        with self._encoding:  # other threads wait for it, but the event loop goes on (no GIL held)
            previous = self.backend.encode_special_tokens
            self.backend.encode_special_tokens = not special_tokens
            try:
                return self.backend.encode_batch([text], add_special_tokens=False)[0].ids
            finally:
                self.backend.encode_special_tokens = previous

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_id(self, name: str) -> int:
        """Id of a token by its text, e.g. ``token_id("<|im_end|>")``; KeyError when absent."""
        token_id = self.maybe_token_id(name)
        if token_id is None:
            raise KeyError(f"token {name!r} is not in the vocabulary")
        return token_id

    def maybe_token_id(self, name: str) -> int | None:
        return self._added.get(name, self.backend.token_to_id(name))

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        enable_thinking: bool | None = None,
        **kwargs: Any,
    ) -> str:
        """Render with this checkpoint's own chat template (see :func:`chat.render_chat`)."""
        if self.chat_template is None:
            raise ValueError(
                "this checkpoint has no chat template (chat_template.jinja or tokenizer_config.json)"
            )
        return render_chat(
            self.chat_template,
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            enable_thinking=enable_thinking,
            **kwargs,
        )


def load_tokenizer(model_dir: str | Path) -> Tokenizer | None:
    """The tokenizer of a checkpoint folder, or None when it has no ``tokenizer.json``.

    An unreadable ``tokenizer.json`` or ``tokenizer_config.json`` is a :class:`CheckpointError`
    naming the file."""
    model_dir = Path(model_dir)
    path = model_dir / TOKENIZER_FILE
    if not path.is_file():
        return None
    eos_token = None
    config_path = model_dir / TOKENIZER_CONFIG_FILE
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{config_path} is not readable JSON: {exc}") from exc
        eos = config.get("eos_token") if isinstance(config, Mapping) else None
        eos_token = eos.get("content") if isinstance(eos, Mapping) else eos
    try:
        return Tokenizer.from_file(path, eos_token=eos_token, chat_template=load_chat_template(model_dir))
    except ValueError as exc:
        raise CheckpointError(str(exc)) from exc
