"""What the TUI tests share: a real repository, replay files written as the model would write, and
the app built on them with a real sandbox, plus waiting on the app's state with a generous deadline."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from textual.pilot import Pilot

from clover_agent.agent.records import RecordKey
from clover_agent.backends.base import ModelBackend
from clover_agent.backends.openai import OpenAIBackend
from clover_agent.backends.replay import ReplayBackend, load_replay
from clover_agent.cli.options import record_key
from clover_agent.session.assembly import SessionConfig
from clover_agent.session.store import SavedSession
from clover_agent.settings import Settings
from clover_agent.tui.app import CloverApp
from clover_agent.tui.policies import policy_named
from tests.clover_agent.test_backend_openai import ChatServer
from tests.git_repos import git
from tests.sandbox_specs import sandbox_spec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "calculator"
DEADLINE_S = 120.0


def calculator_repo(root: Path) -> Path:
    """A git repository holding a copy of examples/calculator (its ``add`` subtracts), without the
    run records, caches and the like that running the README's demo leaves there."""
    repo = root / "calculator"
    shutil.copytree(EXAMPLE, repo, ignore=shutil.ignore_patterns(".clover", "__pycache__", ".pytest_cache"))
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial")
    return repo


def call(name: str, **parameters: object) -> str:
    """A tool call in the Qwen3.6 format."""
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in parameters.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def turn(text: str = "", *calls: str, think: str | None = None) -> str:
    parts = [f"<think>\n{think}\n</think>\n\n" if think else "", text, "\n\n" if text and calls else ""]
    return "".join(parts) + "\n".join(calls)


def write_replay(path: Path, turns: list[str]) -> Path:
    path.write_text("".join(json.dumps({"content": t}) + "\n" for t in turns), encoding="utf-8")
    return path


FIX_ADD = call(
    "editor",
    command="str_replace",
    path="/workspace/calculator.py",
    old_str='    """Return the sum of a and b."""\n    return a - b',
    new_str='    """Return the sum of a and b."""\n    return a + b',
)


def make_app(
    repo: Path,
    backend: Callable[[], ModelBackend] | Path,
    *,
    sandbox: str = "local",
    policy: str = "workspace",
    resume: SavedSession | None = None,
    theme: str = "dark",
    policy_chosen: bool = True,
) -> CloverApp:
    make = (lambda: ReplayBackend(backend)) if isinstance(backend, Path) else backend
    options = SessionConfig(repo=repo, make_backend=make, spec=sandbox_spec(repo), sandbox_kind=sandbox,
                            policy=policy_named(policy), resume=resume, record_key=session_key(repo),
                            policy_chosen=policy_chosen)  # fmt: skip
    return CloverApp(options, theme=theme)


def session_key(repo: Path) -> RecordKey:
    """The key ``clover-agent tui`` signs sessions with (in the test's own state folder)."""
    return record_key(Settings.load(), repo).for_kind("session")


async def wait_for(
    pilot: Pilot, condition: Callable[[], object], what: str, deadline_s: float = DEADLINE_S
) -> None:
    """Let the app run until ``condition()`` holds; fail naming ``what`` after the deadline."""
    end = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


async def send(pilot: Pilot, text: str) -> None:
    """Type ``text`` into the prompt and press Enter."""
    app = pilot.app
    assert isinstance(app, CloverApp)
    app.prompt.focus()
    app.prompt.load_text(text)
    await pilot.press("end", "enter")


class SlowReplay:
    """A slow model: the turns of a replay file (read with the replay backend's own loader) streamed
    by a real local chat-completions server, ``chunk`` characters every ``pauses[i]`` seconds for
    turn ``i`` (the last pause for the rest), to the real openai backend."""

    def __init__(self, replay: Path, pauses: list[float], chunk: int = 8) -> None:
        self.server = ChatServer()
        for index, entry in enumerate(load_replay(replay)):
            text = entry.text
            pieces = [text[i : i + chunk] for i in range(0, len(text), chunk)]
            events: list[object] = [_delta({"content": p}) for p in pieces]
            self.server.replies.append(
                {"sse": [*events, _delta({}, "stop"), "[DONE]"], "pause": pauses[min(index, len(pauses) - 1)]}
            )

    def backend(self) -> OpenAIBackend:
        return OpenAIBackend(self.server.base_url, api_key="", retries=0)

    def close(self) -> None:
        self.server.close()


def _delta(delta: dict[str, object], finish: str | None = None) -> dict[str, object]:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
