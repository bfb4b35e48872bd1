"""An error no layer expects (here a ``RecursionError`` the real openai backend raises on tool-call
arguments nested deeper than Python's JSON reader goes, from a real local server) still ends the
run with its ``Done``: the agent is not left running, the error reaches the caller, and the next
request in the same conversation runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from clover_agent.agent import Agent
from clover_agent.backends.openai import OpenAIBackend
from clover_agent.events import Done, Event, EventBus
from clover_agent.sandboxes.factory import create_sandbox
from tests.clover_agent.test_agent_loop import FINISH
from tests.clover_agent.test_backend_openai import ChatServer
from tests.git_repos import make_repo
from tests.sandbox_specs import sandbox_spec

TOO_DEEP = "[" * 100_000 + "]" * 100_000


def _chunk(delta: dict[str, object], finish: str | None = None) -> dict[str, object]:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


async def test_an_unexpected_error_ends_the_run_and_the_next_request_runs(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"greet.py": "def greet(name):\n    return 'hello ' + name\n"})
    server = ChatServer()
    deep = {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "shell", "arguments": TOO_DEEP}}]}
    server.replies.append({"sse": [_chunk(deep), _chunk({}, "tool_calls"), "[DONE]"]})
    server.replies.append({"sse": [_chunk({"content": FINISH}), _chunk({}, "stop"), "[DONE]"]})
    seen: list[Event] = []
    bus = EventBus()
    bus.subscribe(seen.append)
    backend = OpenAIBackend(server.base_url, api_key="", retries=0)
    try:
        async with create_sandbox("local", sandbox_spec(repo)) as sandbox:
            agent = Agent(backend, sandbox, bus, run_id="unexpected")
            with pytest.raises(RecursionError):
                await agent.run("Do it.", "You are a test agent.")
            assert not agent.running
            (done,) = [e for e in seen if isinstance(e, Done)]
            assert done.outcome == "error" and "unexpected error: RecursionError" in done.message

            result = await agent.continue_with("Try again.")
            assert result.submitted and not agent.running
            assert [e.outcome for e in seen if isinstance(e, Done)] == ["error", "submitted"]
    finally:
        await backend.close()
        server.close()
