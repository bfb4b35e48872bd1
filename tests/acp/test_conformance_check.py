"""The schema check every ACP test ends with finds what does not conform: a message that is not
JSON-RPC 2.0, params or a result the protocol's schema does not describe exactly, a request never
answered."""

from __future__ import annotations

import pytest
from acp.connection import StreamDirection, StreamEvent

from tests.acp.helpers import check_conformance

OUT, IN = StreamDirection.OUTGOING, StreamDirection.INCOMING
TEXT = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}}


def _events(*messages: tuple[StreamDirection, dict]) -> list[StreamEvent]:
    return [StreamEvent(direction, message) for direction, message in messages]


def test_conforming_messages_pass() -> None:
    messages = _events(
        (OUT, {"jsonrpc": "2.0", "id": 0, "method": "session/prompt",
               "params": {"sessionId": "s", "prompt": [{"type": "text", "text": "go"}]}}),
        (IN, {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s", "update": TEXT}}),
        (IN, {"jsonrpc": "2.0", "id": 0, "result": {"stopReason": "end_turn"}}),
    )  # fmt: skip
    assert check_conformance(messages) == 3


@pytest.mark.parametrize(
    "bad",
    [
        {"jsonrpc": "1.0", "method": "session/update", "params": {"sessionId": "s", "update": TEXT}},
        {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s", "update": {**TEXT, "sessionUpdate": "chatter"}}},
        {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s", "update": {**TEXT, "extra": 1}}},
        {"jsonrpc": "2.0", "method": "session/update", "params": {"update": TEXT}},
        {"jsonrpc": "2.0", "method": "no/such", "params": {}},
        {"jsonrpc": "2.0", "id": 3, "method": "session/request_permission", "params": {"sessionId": "s", "toolCall": {"toolCallId": "c"}, "options": []}},
    ],
)  # fmt: skip
def test_what_does_not_conform_fails(bad: dict) -> None:
    with pytest.raises((AssertionError, ValueError)):
        check_conformance(_events((IN, bad)))


def test_a_wrong_result_fails() -> None:
    messages = _events(
        (
            OUT,
            {"jsonrpc": "2.0", "id": 0, "method": "session/new", "params": {"cwd": "/x", "mcpServers": []}},
        ),
        (IN, {"jsonrpc": "2.0", "id": 0, "result": {"session": "s"}}),
    )
    with pytest.raises((AssertionError, ValueError)):
        check_conformance(messages)
