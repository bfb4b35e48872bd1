from __future__ import annotations

from pathlib import Path

from clover_agent.events import Done, ToolCallFinished
from clover_agent.tui.widgets.agent_text import AgentText
from tests.tui.helpers import calculator_repo, call, make_app, send, turn, wait_for, write_replay


async def test_smoke(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    replay = write_replay(
        tmp_path / "r.jsonl",
        [
            turn("Let me look.", call("run_tests"), think="Start with the tests."),
            turn("", call("finish", summary="Looked at it.")),
        ],
    )
    app = make_app(repo, replay)
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, "check the tests")
        await wait_for(pilot, lambda: any(isinstance(e, Done) for e in app.events), "done")
        assert any(isinstance(e, ToolCallFinished) for e in app.events)
        texts = [w.shown for w in app.query(AgentText)]
        assert "Let me look." in texts
        app.save_screenshot(str(tmp_path / "tui-smoke.svg"))
        assert "<svg" in (tmp_path / "tui-smoke.svg").read_text()
        await pilot.press("ctrl+q")
