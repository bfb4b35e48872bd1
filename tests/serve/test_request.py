"""A chat-completions body read field by field: what the server honours, how messages are made
ready for the chat template, and what it refuses."""

from __future__ import annotations

import json

import pytest

from clover_agent.serve.errors import ApiError
from clover_agent.serve.request import read_chat_request


def _body(**fields: object) -> dict:
    return {"model": "clover", "messages": [{"role": "user", "content": "hi"}], **fields}


def test_openai_and_clover_fields_become_sampling_changes() -> None:
    chat = read_chat_request(
        _body(
            temperature=0, top_p=0.5, seed=7, max_completion_tokens=99, max_tokens=5, presence_penalty=0.5,
            mode="self_speculative", threshold=0.9, thinking_budget=64, stop="END", stream=True,
            stream_options={"include_usage": True}, chat_template_kwargs={"enable_thinking": False},
            logit_bias={"1": 2}, user="someone",  # unknown to the server: ignored
        )
    )  # fmt: skip
    assert chat.sampling == {
        "temperature": 0.0, "top_p": 0.5, "seed": 7, "presence_penalty": 0.5, "mode": "self_speculative",
        "threshold": 0.9, "thinking_budget": 64, "top_k": 0,
    }  # fmt: skip
    assert (chat.max_tokens, chat.stop, chat.stream, chat.include_usage, chat.enable_thinking) == (
        99, ("END",), True, True, False,
    )  # fmt: skip


def test_messages_are_made_ready_for_the_template() -> None:
    chat = read_chat_request(
        _body(
            messages=[
                {"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
                {"role": "user", "content": "hi", "name": "ann"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": '{"command":"ls"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "a.py"},
            ],
            tools=[{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}],
        )
    )  # fmt: skip
    assert chat.messages[0] == {"role": "system", "content": "Be brief."}
    assert chat.messages[1] == {"role": "user", "content": "hi"}
    call = chat.messages[2]["tool_calls"][0]
    assert call["id"] == "call_1" and json.loads(call["function"]["arguments"]) == {"command": "ls"}
    assert chat.messages[2]["content"] == ""
    assert chat.messages[3] == {"role": "tool", "content": "a.py", "tool_call_id": "call_1"}
    assert [t["function"]["name"] for t in chat.tools] == ["shell"]


def test_tool_choice_none_offers_no_tools() -> None:
    tools = [{"type": "function", "function": {"name": "shell"}}]
    assert read_chat_request(_body(tools=tools, tool_choice="none")).tools == []
    assert len(read_chat_request(_body(tools=tools, tool_choice="auto")).tools) == 1
    with pytest.raises(ApiError) as named:
        read_chat_request(_body(tools=tools, tool_choice={"type": "function", "function": {"name": "shell"}}))
    assert named.value.status == 400 and named.value.code == "unsupported_value"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ([], None),
        ({"messages": []}, "model"),
        (_body(model=3), "model"),
        (_body(messages="hi"), "messages"),
        (_body(top_p=True), "top_p"),  # a boolean is not a number
        (_body(seed=1.5), "seed"),
        (_body(temperature=float("nan")), "temperature"),
        (_body(stream="yes"), "stream"),
        (_body(stop=["a"] * 17), "stop"),
        (_body(mode=3), "mode"),
        (_body(chat_template_kwargs={"enable_thinking": "no"}), "chat_template_kwargs"),
        (_body(tools=[{"type": "function", "function": {"name": ""}}]), "tools"),
        (_body(tools=[{"type": "function", "function": {"name": "x", "parameters": []}}]), "tools"),
        (_body(messages=[{"role": "user"}]), "messages[0].content"),
        (_body(logprobs=True), "logprobs"),
        (_body(temperature=10**400), "temperature"),  # past a float: not a number here
        (_body(top_p=-(10**400)), "top_p"),
        (_body(seed=2**64), "seed"),
        (_body(temperature=1e-308), "temperature"),  # finite, but inf or NaN in float32 sampling
        (_body(temperature=1e308), "temperature"),
        (_body(top_p=5e-324), "top_p"),
        (_body(repetition_penalty=1e-308), "repetition_penalty"),
        (_body(presence_penalty=1e308), "presence_penalty"),
        (_body(frequency_penalty=1e308), "frequency_penalty"),
        (_body(loop_penalty=1e308), "loop_penalty"),
        (_body(seed=-(2**63) - 1), "seed"),
    ],
)
def test_wrong_types_and_values_are_400_naming_the_field(body: object, param: str | None) -> None:
    with pytest.raises(ApiError) as error:
        read_chat_request(body)
    assert error.value.status == 400 and error.value.param == param
    assert error.value.body()["error"]["type"] == "invalid_request_error"


def test_a_body_nested_past_the_limit_is_refused_before_anything_walks_it() -> None:
    from clover_agent.serve.request import MAX_DEPTH

    def nested(depth: int) -> dict:
        schema: dict = {"type": "string"}
        for _ in range(depth):
            schema = {"type": "object", "properties": {"a": schema}}
        return _body(tools=[{"type": "function", "function": {"name": "x", "parameters": schema}}])

    assert read_chat_request(nested(MAX_DEPTH // 2 - 4)).tools  # a deep but sane schema is fine
    with pytest.raises(ApiError) as error:
        read_chat_request(nested(900))  # what the chat template would recurse through until it broke
    assert error.value.status == 400 and "deeper than" in error.value.message
    assert read_chat_request(_body(seed=2**64 - 1, temperature=10**2)).sampling["seed"] == 2**64 - 1


def test_parallel_tool_calls_false_allows_one_call_and_a_non_boolean_is_400() -> None:
    assert read_chat_request(_body()).parallel_tool_calls is True
    assert read_chat_request(_body(parallel_tool_calls=True)).parallel_tool_calls is True
    assert read_chat_request(_body(parallel_tool_calls=False)).parallel_tool_calls is False
    with pytest.raises(ApiError) as bad:
        read_chat_request(_body(parallel_tool_calls="no"))
    assert bad.value.param == "parallel_tool_calls"
