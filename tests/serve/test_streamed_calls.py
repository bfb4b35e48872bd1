"""Tool calls streamed as they are written (serve.answer.AnswerStream): each call starts with its
id and name, its arguments come a parameter at a time, and the deltas joined are the whole answer
and the lenient parser's reading of the same text, wherever the text is split into blocks."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from clover_agent.protocol import parse_tool_calls
from clover_agent.serve.answer import AnswerStream, chunk_body, completion_body, usage
from tests.clover_agent.test_protocol_fuzz import TOOLS as FUZZ_TOOLS
from tests.clover_agent.test_protocol_fuzz import _turns as fuzz_turns

TOOLS = [
    {"type": "function", "function": {"name": "shell", "parameters": {"type": "object", "properties": {
        "command": {"type": "string"}, "timeout": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "write", "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}, "content": {"type": "string"}, "mode": {"type": "object"}}}}},
]  # fmt: skip

TWO_CALLS = (
    "I'll write the file, then run it.\n\n"
    "<tool_call>\n<function=write>\n<parameter=path>\na.py\n</parameter>\n"
    '<parameter=content>\nprint("hi")\n</parameter>\n<parameter=mode>\n{"x": 1}\n</parameter>\n'
    "</function>\n</tool_call>\n"
    "<tool_call>\n<function=shell>\n<parameter=command>\npython a.py\n</parameter>\n"
    "<parameter=timeout>\n30\n</parameter>\n</function>\n</tool_call>"
)
#: A value that documents the format: the call inside it is data (docs/tool-call-parsing.md).
QUOTED = (
    "<tool_call>\n<function=write>\n<parameter=path>\ndoc.md\n</parameter>\n<parameter=content>\n"
    "Call a tool so:\n<tool_call>\n<function=shell>\n<parameter=command>\nls\n</parameter>\n</function>\n"
    "</tool_call>\nand wait.\n</parameter>\n</function>\n</tool_call>\nDone."
)
UNOFFERED = (
    "First <b>this</b>.\n<tool_call>\n<function=delete_all>\n<parameter=path>\n/\n</parameter>\n</function>\n"
    "</tool_call>\n<tool_call>\n<function=shell>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>"
)
BARE = "Text.\n<function=shell>\n<parameter=command>\nls\n</parameter>\n</function>\nAfter the call."
CUT_OFF = (
    "Go.\n<tool_call>\n<function=write>\n<parameter=path>\nb.py\n</parameter>\n<parameter=content>\nx = "
)
BROKEN = "<tool_call>\n<function=shell>\nno parameters here\n</function>\n</tool_call>\nThen text."
TEXTS = [TWO_CALLS, QUOTED, UNOFFERED, BARE, CUT_OFF, BROKEN, "Just text, no calls.\n\n"]


def _stream(
    pieces: list[str], tools: list[dict[str, Any]] = TOOLS
) -> tuple[AnswerStream, list[dict[str, Any]]]:
    answer = AnswerStream(tools, thinking=False)
    deltas = [d for piece in pieces for d in answer.feed(piece)]
    return answer, deltas + answer.finish()


def _joined(deltas: list[dict[str, Any]]) -> dict[str, Any]:
    """The deltas as a client joins them, checking OpenAI's streaming shape of each call on the way."""
    content, calls = "", list[dict[str, Any]]()
    for delta in deltas:
        content += delta.get("content", "")
        for entry in delta.get("tool_calls", []):
            assert list(delta) == ["tool_calls"] and len(delta["tool_calls"]) == 1
            if entry["index"] == len(calls):  # a call's first delta: its id and name, no arguments yet
                assert set(entry) == {"index", "id", "type", "function"} and entry["type"] == "function"
                assert entry["function"]["arguments"] == "" and entry["id"].startswith("call_")
                calls.append({"id": entry["id"], "name": entry["function"]["name"], "fragments": []})
            else:  # then only fragments of its arguments, for the call being written
                assert entry["index"] == len(calls) - 1 and entry == {
                    "index": entry["index"],
                    "function": {"arguments": entry["function"]["arguments"]},
                }
                calls[-1]["fragments"].append(entry["function"]["arguments"])
    return {"content": content, "calls": calls}


def _reading(answer: AnswerStream, deltas: list[dict[str, Any]]) -> tuple[str, list[tuple[str, str]]]:
    """(content, [(name, arguments)]) of the stream, checked against the whole answer it makes."""
    joined = _joined(deltas)
    message = answer.message()
    assert (message["content"] or "") == joined["content"]
    whole = [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])
    ]
    assert whole == [(c["id"], c["name"], "".join(c["fragments"])) for c in joined["calls"]]
    return joined["content"], [(name, arguments) for _, name, arguments in whole]


def _parser(text: str, tools: list[dict[str, Any]] = TOOLS) -> tuple[str, list[tuple[str, str]]]:
    content, calls = parse_tool_calls(text, tools, offered_only=True, max_chars=None)
    return content, [(c.name, json.dumps(c.arguments, ensure_ascii=False)) for c in calls]


def _check(
    text: str, pieces: list[str], tools: list[dict[str, Any]] = TOOLS
) -> tuple[str, list[tuple[str, str]]]:
    answer, deltas = _stream(pieces, tools)
    content, calls = _reading(answer, deltas)
    parsed_content, parsed_calls = _parser(text, tools)
    assert content.strip() == parsed_content
    if answer.cut_off:  # the calls before it are the parser's; the cut-off one's arguments never close
        assert calls[:-1] == parsed_calls and not calls[-1][1].endswith("}")
        assert answer.finish_reason("length") == "length"
    else:
        assert calls == parsed_calls
    return content, calls


@pytest.mark.parametrize(
    "text", TEXTS, ids=["two-calls", "quoted", "unoffered", "bare", "cut-off", "broken", "text"]
)
def test_every_split_point_gives_the_parsers_answer(text: str) -> None:
    whole = _check(text, [text])
    assert _check(text, list(text)) == whole  # a character at a time
    for i in range(len(text) + 1):  # two blocks, split at every character boundary
        assert _check(text, [text[:i], text[i:]]) == whole, i
    for i in range(0, len(text), 7):  # three blocks
        j = (i * 5) % (len(text) + 1)
        assert _check(text, [text[: min(i, j)], text[min(i, j) : max(i, j)], text[max(i, j) :]]) == whole


def test_calls_start_with_their_name_and_stream_their_arguments_as_written() -> None:
    answer = AnswerStream(TOOLS, thinking=False)
    when: list[tuple[int, dict[str, Any]]] = []  # (characters fed, delta)
    for n, char in enumerate(TWO_CALLS, 1):
        when += [(n, d) for d in answer.feed(char)]
    when += [(len(TWO_CALLS), d) for d in answer.finish()]
    deltas = [d for _, d in when]
    content, calls = _reading(answer, deltas)
    assert content == "I'll write the file, then run it."
    assert calls == _parser(TWO_CALLS)[1] and [name for name, _ in calls] == ["write", "shell"]
    assert json.loads(calls[0][1]) == {"path": "a.py", "content": 'print("hi")', "mode": {"x": 1}}
    fragments = [c["fragments"] for c in _joined(deltas)["calls"]]
    assert fragments[0] == ['{"path": "a.py"', ', "content": "print(\\"hi\\")"', ', "mode": {"x": 1}', "}"]
    assert fragments[1] == ['{"command": "python a.py"', ', "timeout": 30', "}"]
    assert answer.finish_reason("stop") == "tool_calls"
    # Each call started, and its first parameter went out, before its </function> was written.
    first_close = TWO_CALLS.index("</function>")
    second_close = TWO_CALLS.index("</function>", first_close + 1)
    starts = [n for n, d in when if "id" in d.get("tool_calls", [{}])[0]]
    first_fragments = [
        n for n, d in when if d.get("tool_calls", [{}])[0].get("function", {}).get("arguments", "")[:1] == "{"
    ]
    assert starts[0] < first_fragments[0] < first_close and starts[1] < first_fragments[1] < second_close
    # A call starts once its first parameter's tag is written after its name.
    assert starts[0] == TWO_CALLS.index("<parameter=path>") + len("<parameter=path>\n")


def test_a_call_to_a_tool_not_offered_stays_text_and_never_starts() -> None:
    answer, deltas = _stream(list(UNOFFERED))
    content, calls = _reading(answer, deltas)
    assert [name for name, _ in calls] == ["shell"]
    assert all(
        e["function"].get("name") != "delete_all"
        for d in deltas
        for e in d.get("tool_calls", [])
        if "id" in e
    )
    assert "<function=delete_all>" in content and content.startswith("First <b>this</b>.")
    assert "<function=shell>" not in content


def test_a_call_cut_off_is_left_as_sent_and_never_closes() -> None:
    answer, deltas = _stream(list(CUT_OFF))
    content, calls = _reading(answer, deltas)
    assert content == "Go." and calls == [("write", '{"path": "b.py"')]
    assert answer.cut_off and answer.finish_reason("length") == "length"
    assert answer.finish_reason("stop") == "stop"
    with pytest.raises(json.JSONDecodeError):
        json.loads(calls[0][1])  # no client can run it


_PIECES = [
    "<tool_call>\n", "</tool_call>\n", "<function=shell>\n", "<function=write>\n", "<function=nope>\n",
    "</function>\n", "</function>", "<parameter=command>\n", "<parameter=path>\n", "<parameter=content>\n",
    "<parameter=timeout>\n", "<parameter=mode>\n", "</parameter>\n", "</parameter>", "ls -la\n", "30\n",
    '{"a": [1, 2]}\n', "some text ", "\n", "  ", "<", "</tool_call", "<function=", "x.py\n",
]  # fmt: skip
_CALL = "<tool_call>\n<function={}>\n<parameter={}>\n{}\n</parameter>\n</function>\n</tool_call>\n"


def test_random_texts_stream_as_the_parser_reads_them() -> None:
    rng = random.Random(20261207)
    for _ in range(300):
        parts = []
        for _ in range(rng.randint(1, 25)):
            if rng.random() < 0.2:
                name, param = rng.choice(
                    [("shell", "command"), ("write", "path"), ("nope", "x"), ("shell", "timeout")]
                )
                parts.append(_CALL.format(name, param, rng.choice(["ls", "30", "a b", ""])))
            else:
                parts.append(rng.choice(_PIECES))
        text = "".join(parts)
        whole = _check(text, [text])
        assert _check(text, list(text)) == whole, text
        cuts = sorted(rng.sample(range(len(text) + 1), min(4, len(text) + 1)))
        assert (
            _check(text, [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]) == whole
        ), text


def test_the_openai_package_joins_the_stream_into_the_whole_answer() -> None:
    answer, deltas = _stream([TWO_CALLS[i : i + 9] for i in range(0, len(TWO_CALLS), 9)])
    finish = answer.finish_reason("stop")
    whole = ChatCompletion.model_validate(
        completion_body("c", 1, "clover", answer.message(), finish, usage(9, 9, 0))
    )
    state = ChatCompletionStreamState()
    bodies = [{"role": "assistant", "content": ""}, *deltas, {}]
    for n, delta in enumerate(bodies):
        chunk = chunk_body("c", 1, "clover", delta, finish if n == len(bodies) - 1 else None)
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    streamed = state.get_final_completion()

    def calls(read: ChatCompletion) -> list[tuple[str, str, str]]:
        found = read.choices[0].message.tool_calls or []
        return [(c.id, c.function.name, c.function.arguments) for c in found if c.type == "function"]

    assert calls(streamed) == calls(whole) and len(calls(whole)) == 2
    assert streamed.choices[0].message.content == whole.choices[0].message.content
    assert streamed.choices[0].finish_reason == whole.choices[0].finish_reason == "tool_calls"


def test_a_stop_string_inside_a_started_call_cuts_it_off() -> None:
    answer = AnswerStream(TOOLS, thinking=False, stop=("python a.py",))
    deltas = [d for char in TWO_CALLS for d in answer.feed(char)] + answer.finish()
    content, calls = _reading(answer, deltas)
    assert answer.stopped and answer.cut_off
    assert content == "I'll write the file, then run it."
    assert calls[0] == _parser(TWO_CALLS)[1][0] and calls[1] == ("shell", "")  # started, no parameter ended
    assert answer.finish_reason("length") == "stop"


def test_a_long_call_full_of_tags_takes_work_linear_in_its_length() -> None:
    # A file that documents the format: thousands of tags in one value, scanned again as it grows.
    body = "".join(f"<parameter=x{i}>\nv</parameter>\n" for i in range(4000))
    text = TWO_CALLS.replace('print("hi")', body)
    answer, deltas = _stream([text[i : i + 100] for i in range(0, len(text), 100)])
    assert _reading(answer, deltas) == (_parser(text)[0], _parser(text)[1])
    assert answer.scan_work < 20 * len(text)  # every block scanning it all again: ~ len(text) ** 2 / 200


def test_hostile_turns_stream_as_the_parser_reads_them() -> None:
    # The protocol fuzzer's turns: values that quote whole calls, unicode, special-token text, CRLF.
    rng = random.Random(11)
    for text, _, _ in fuzz_turns(13, 150):
        if "</think>" in text:  # the reasoning is the splitter's, tested apart
            continue
        whole = _check(text, [text], FUZZ_TOOLS)
        assert _check(text, list(text), FUZZ_TOOLS) == whole, text
        cuts = sorted(rng.sample(range(len(text) + 1), min(6, len(text) + 1)))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert _check(text, pieces, FUZZ_TOOLS) == whole, text


def test_one_call_allowed_ends_the_answer_with_its_first_call() -> None:
    """``parallel_tool_calls: false``: the answer ends once its first call to an offered tool is
    closed (``stopped``, so decoding stops there); what follows is dropped, wherever the blocks end."""
    whole, _ = _stream([TWO_CALLS])
    first = whole.message()["tool_calls"][0]
    for pieces in (
        [TWO_CALLS],
        list(TWO_CALLS),
        *([TWO_CALLS[:i], TWO_CALLS[i:]] for i in range(len(TWO_CALLS))),
    ):
        answer = AnswerStream(TOOLS, thinking=False, one_call=True)
        deltas: list[dict[str, Any]] = []
        fed = 0
        for piece in pieces:
            if answer.stopped:
                break
            deltas += answer.feed(piece)
            fed += len(piece)
        assert answer.stopped
        if len(pieces) == len(TWO_CALLS):  # a character at a time: stopped before the second call
            assert fed <= TWO_CALLS.index("<function=shell>")
        deltas += answer.finish()
        message = answer.message()
        assert [c["function"] for c in message["tool_calls"]] == [first["function"]]
        assert message["content"] == "I'll write the file, then run it."
        assert answer.finish_reason("stop") == "tool_calls"
        assert not any(d.get("tool_calls", [{}])[0].get("index") == 1 for d in deltas)
    # a call to a tool not offered is text, not the one call: the answer goes on to the next
    answer = AnswerStream(TOOLS, thinking=False, one_call=True)
    answer.feed(UNOFFERED)
    answer.finish()
    assert [c["function"]["name"] for c in answer.message()["tool_calls"]] == ["shell"]
    assert "delete_all" in answer.message()["content"]
