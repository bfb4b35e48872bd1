"""Model text into OpenAI's answer, checked with the real Qwen3.6 vocabulary (the text goes through
the tokenizer and comes back block by block, as the engine commits it) and read back by the
``openai`` package's own types and stream accumulator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from clover_agent.engine.text.tokenizer import load_tokenizer
from clover_agent.serve.answer import (
    AnswerStream,
    StopStrings,
    chunk_body,
    completion_body,
    tokens_through,
    usage,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}}},
        },
    },
    {"type": "function", "function": {"name": "finish", "parameters": {"type": "object", "properties": {"summary": {"type": "string"}}}}},
]  # fmt: skip
#: What Clover writes after a generation prompt that opened <think>: reasoning, a sentence, two calls.
MODEL_TEXT = (
    "The tests fail in utils.py; let me look at it first.\n</think>\n\n"
    "I'll list the files, then stop.\n\n"
    "<tool_call>\n<function=shell>\n<parameter=command>\nls -la src/\n</parameter>\n"
    "<parameter=timeout>\n30\n</parameter>\n</function>\n</tool_call>\n"
    '<tool_call>\n<function=finish>\n<parameter=summary>\nNothing to do: "done" <ok>\n</parameter>\n</function>\n</tool_call>'
)


@pytest.fixture(scope="module")
def blocks(real_vocab_checkpoint: Path) -> list[str]:
    """MODEL_TEXT as the engine commits it: 32-token blocks, each block's text."""
    tokenizer = load_tokenizer(real_vocab_checkpoint)
    assert tokenizer is not None
    ids = tokenizer.encode(MODEL_TEXT)
    pieces = [tokenizer.decode(ids[i : i + 32]) for i in range(0, len(ids), 32)]
    assert "".join(pieces) == MODEL_TEXT and len(pieces) >= 3
    return pieces


def _run(pieces: list[str], **kwargs: object) -> tuple[AnswerStream, list[dict]]:
    answer = AnswerStream(kwargs.pop("tools", TOOLS), thinking=kwargs.pop("thinking", True), **kwargs)  # type: ignore[arg-type]
    deltas = [d for piece in pieces for d in answer.feed(piece)]
    return answer, deltas + answer.finish()


def test_reasoning_content_and_tool_calls_from_committed_blocks(blocks: list[str]) -> None:
    answer, deltas = _run(blocks)
    message = answer.message()
    assert message["reasoning_content"] == "The tests fail in utils.py; let me look at it first."
    assert message["content"].strip() == "I'll list the files, then stop."
    calls = message["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["shell", "finish"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"command": "ls -la src/", "timeout": 30}
    assert json.loads(calls[1]["function"]["arguments"]) == {"summary": 'Nothing to do: "done" <ok>'}
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)
    assert len({c["id"] for c in calls}) == 2
    assert answer.finish_reason("stop") == "tool_calls"
    # The call's markup never went out as content while streaming.
    streamed = "".join(d.get("content", "") for d in deltas)
    assert "<tool_call>" not in streamed and "<function" not in streamed and "<tool_call" not in streamed
    # Each call starts with its own delta (index, id, name), in order.
    starts = [e for d in deltas for e in d.get("tool_calls", []) if "id" in e]
    assert [(e["index"], e["id"], e["function"]["name"]) for e in starts] == [
        (i, c["id"], c["function"]["name"]) for i, c in enumerate(calls)
    ]


def test_any_split_of_the_text_gives_the_same_answer(blocks: list[str]) -> None:
    def without_ids(message: dict) -> dict:
        return {
            **message,
            "tool_calls": [{k: v for k, v in c.items() if k != "id"} for c in message["tool_calls"]],
        }

    text = "".join(blocks)
    whole = without_ids(_run([text])[0].message())
    for size in (1, 2, 5, 13):
        message = _run([text[i : i + size] for i in range(0, len(text), size)])[0].message()
        assert without_ids(message) == whole, size


def test_the_openai_client_reads_the_whole_answer_and_the_stream(blocks: list[str]) -> None:
    answer, deltas = _run(blocks)
    used = usage(120, 64, 96)
    body = completion_body("chatcmpl-1", 1, "clover", answer.message(), answer.finish_reason("stop"), used)
    parsed = ChatCompletion.model_validate(body)
    assert parsed.choices[0].finish_reason == "tool_calls"
    assert parsed.choices[0].message.tool_calls is not None
    assert parsed.usage is not None and parsed.usage.prompt_tokens_details is not None
    assert parsed.usage.prompt_tokens_details.cached_tokens == 96
    assert parsed.usage.total_tokens == 184

    state = ChatCompletionStreamState()
    chunks = [chunk_body("chatcmpl-1", 1, "clover", {"role": "assistant", "content": ""})]
    chunks += [chunk_body("chatcmpl-1", 1, "clover", d) for d in deltas]
    chunks += [chunk_body("chatcmpl-1", 1, "clover", {}, answer.finish_reason("stop"))]
    chunks += [chunk_body("chatcmpl-1", 1, "clover", None, used=used)]
    for chunk in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    final = state.get_final_completion()
    message = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []] == [
        ("shell", {"command": "ls -la src/", "timeout": 30}),
        ("finish", {"summary": 'Nothing to do: "done" <ok>'}),
    ]
    assert (message.content or "").strip() == "I'll list the files, then stop."
    assert final.usage is not None and final.usage.completion_tokens == 64


def test_without_tools_the_markup_is_content(blocks: list[str]) -> None:
    answer, _ = _run(blocks, tools=[])
    message = answer.message()
    assert "tool_calls" not in message and "<tool_call>" in message["content"]
    assert answer.finish_reason("length") == "length" and answer.finish_reason("stop") == "stop"


def test_without_thinking_everything_is_content(blocks: list[str]) -> None:
    answer, _ = _run(["Plain answer ", "with no reasoning."], thinking=False)
    assert answer.message() == {
        "role": "assistant",
        "content": "Plain answer with no reasoning.",
        "reasoning_content": None,
    }


def test_a_stop_string_across_blocks_cuts_there(blocks: list[str]) -> None:
    answer, _deltas = _run(blocks, stop=("list the", "never written"))
    assert answer.stopped
    assert answer.message()["content"] == "I'll "
    assert answer.finish_reason("length") == "stop"
    cut = StopStrings(("END",))
    assert [cut.feed(p) for p in ("abc E", "N", "D tail")] == ["abc ", "", ""] and cut.hit


def _client_reads(answer: AnswerStream, deltas: list[dict]) -> tuple[ChatCompletion, ChatCompletion]:
    """The whole answer and the stream, as the ``openai`` package reads them."""
    finish = answer.finish_reason("stop")
    used = usage(10, 5, 0)
    whole = ChatCompletion.model_validate(completion_body("c", 1, "clover", answer.message(), finish, used))
    state = ChatCompletionStreamState()
    chunks = [chunk_body("c", 1, "clover", {"role": "assistant", "content": ""})]
    chunks += [chunk_body("c", 1, "clover", d) for d in deltas]
    chunks += [chunk_body("c", 1, "clover", {}, finish)]
    for chunk in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    return whole, state.get_final_completion()


def test_a_call_to_a_tool_not_offered_stays_text(blocks: list[str]) -> None:
    # Only `shell` is offered: the `finish` call is the model's text, never a call.
    answer, deltas = _run(blocks, tools=TOOLS[:1])
    finish_call = MODEL_TEXT[MODEL_TEXT.index("<tool_call>\n<function=finish>") :]
    for read in _client_reads(answer, deltas):
        choice = read.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert [c.function.name for c in choice.message.tool_calls or []] == ["shell"]
        assert (choice.message.content or "").startswith("I'll list the files, then stop.")
        assert (choice.message.content or "").endswith(finish_call)
        assert "<function=shell>" not in (choice.message.content or "")


OTHER_TOOL = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("tools", [OTHER_TOOL, []], ids=["other-tool", "tool-choice-none"])
def test_no_call_to_a_tool_not_offered_finishes_as_tool_calls(blocks: list[str], tools: list[dict]) -> None:
    # tool_choice "none" offers no tools (ChatRequest.tools is empty): every call is text.
    answer, deltas = _run(blocks, tools=tools)
    after_thinking = MODEL_TEXT.split("</think>", 1)[1].strip()
    for read in _client_reads(answer, deltas):
        choice = read.choices[0]
        assert choice.finish_reason == "stop"
        assert not choice.message.tool_calls
        assert (choice.message.content or "").strip() == after_thinking  # every call as written


def test_the_tokens_of_an_answer_cut_at_a_stop_string(real_vocab_checkpoint: Path) -> None:
    tokenizer = load_tokenizer(real_vocab_checkpoint)
    assert tokenizer is not None
    ids = tokenizer.encode(MODEL_TEXT)
    answer, _ = _run([tokenizer.decode(ids[i : i + 32]) for i in range(0, len(ids), 32)], stop=("files, th",))
    end = MODEL_TEXT.index("files, th") + len("files, th")
    assert answer.stop.end == end
    used = tokens_through(tokenizer.decode, ids, end)
    # " then" is one token the stop string ends inside: it counts, the tokens after it do not
    assert tokenizer.decode(ids[:used]).endswith("files, then")
    assert tokens_through(tokenizer.decode, ids, end - 1) == used
    assert tokens_through(tokenizer.decode, ids, 0) == 0
    assert tokens_through(tokenizer.decode, ids, len(MODEL_TEXT)) == len(ids)


def test_an_answer_cut_at_the_token_limit_is_length_even_with_calls(blocks: list[str]) -> None:
    """The calls read from a cut answer may be cut themselves (a later call dropped unfinished, a
    value that quotes a call read as its end): ``tool_calls`` told the client the turn was whole."""
    cut = "".join(blocks) + "\n<tool_call>\n<function=shell>\n<parameter=command>\nrm -rf build"
    answer, _ = _run([cut])
    calls = answer.message()["tool_calls"]
    # the third call had started streaming when the answer was cut: it stays, never closed
    assert [c["function"]["name"] for c in calls] == ["shell", "finish", "shell"]
    assert not calls[-1]["function"]["arguments"].endswith("}")
    assert answer.finish_reason("length") == "length"
    assert answer.finish_reason("loop") == "length"
    assert answer.finish_reason("stop") == "stop"  # the end token inside a started call: cut all the same
    whole, _ = _run(["".join(blocks)])
    assert whole.finish_reason("stop") == "tool_calls" and whole.finish_reason("length") == "length"
