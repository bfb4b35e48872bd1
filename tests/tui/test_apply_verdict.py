"""The TUI's ``/apply`` judged as ``fix`` judges: hostile agents replayed in a Docker sandbox leave
the bug in the code and fake the pass from inside the judging process; the apply dialog shows the
verdict of exactly the files offered, never ``fixed`` or "verified", and the person who leaves the
dialog finds their tree unchanged. A part chosen file by file is judged again on its own before it
can be applied, and an honest fix is ``fixed``."""

from __future__ import annotations

from pathlib import Path

import pytest

from clover_agent.events import Done
from clover_agent.tui.app import CloverApp
from clover_agent.tui.screens.apply import ApplyScreen
from clover_agent.tui.widgets.notice import NoticeLine
from tests.clover_agent.fix.test_handback_attacks import _write, tree
from tests.clover_agent.fix.test_verdict_attacks import CHEATS, REST
from tests.tui.helpers import calculator_repo, call, make_app, send, turn, wait_for, write_replay

pytestmark = [pytest.mark.slow, pytest.mark.docker]


def _done(app: CloverApp) -> bool:
    return any(isinstance(e, Done) for e in app.events)


def _dialog(app: CloverApp, files: int | None = None) -> bool:
    screen = app.screen
    return isinstance(screen, ApplyScreen) and (files is None or len(screen.changes) == files)


def _notices(app: CloverApp) -> str:
    return "\n".join(n.text for n in app.query(NoticeLine))


@pytest.mark.parametrize("how", list(CHEATS))
async def test_apply_of_code_that_fakes_its_pass_never_says_fixed(tmp_path: Path, how: str) -> None:
    source, layers = CHEATS[how]
    repo = calculator_repo(tmp_path)
    before = tree(repo)
    replay = write_replay(
        tmp_path / "cheat.jsonl",
        [turn("", _write("calculator.py", source + REST)), turn("", call("finish", summary="Fixed add."))],
    )
    app = make_app(repo, replay, sandbox="docker")
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, "fix add")
        await wait_for(pilot, lambda: _done(app), "the request")
        await send(pilot, "/apply")
        await wait_for(pilot, lambda: _dialog(app), "the apply dialog", deadline_s=300)
        screen = app.screen
        assert isinstance(screen, ApplyScreen)
        verdict = screen.verdict
        assert verdict.startswith(("needs review: ", "not fixed: ")), verdict
        assert "verified" not in verdict.lower().replace("unverified", "")
        assert [c.path for c in screen.changes] == ["calculator.py"]
        if verdict.startswith("needs review"):  # every layer that catches it names it, file and line
            review = "\n".join(screen.review)
            assert all(layer in review for layer in layers), review
            assert "calculator.py:" in review or "two results were reported" in review, review
        await pilot.press("escape")
        await wait_for(pilot, lambda: not _dialog(app), "the dialog to close")
        await pilot.press("ctrl+q")
    assert tree(repo) == before  # nothing applied: the bug is still in the user's code
    assert "return a - b" in (repo / "calculator.py").read_text().split("def subtract")[0]


async def test_a_part_chosen_file_by_file_is_judged_again_before_it_is_applied(tmp_path: Path) -> None:
    """The fix lives in a new module that calculator.py imports; the person rejects the module: the
    part left (calculator.py alone) is judged on its own, offered again as ``not fixed``, and the
    person who leaves that dialog finds their tree unchanged. Applying the whole patch is ``fixed``."""
    repo = calculator_repo(tmp_path)
    before = tree(repo)
    split = call(
        "shell",
        command="sed -i '1a from fast_add import add  # noqa' calculator.py"
        " && sed -i 's/^def add(/def _old_add(/' calculator.py",
    )
    replay = write_replay(
        tmp_path / "split.jsonl",
        [
            turn("", _write("fast_add.py", "def add(a, b):\n    return a + b\n")),
            turn("", split),
            turn("", call("finish", summary="Fixed add.")),
        ],
    )
    app = make_app(repo, replay, sandbox="docker")
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, "fix add")
        await wait_for(pilot, lambda: _done(app), "the request")
        await send(pilot, "/apply")
        await wait_for(pilot, lambda: _dialog(app, 2), "the apply dialog", deadline_s=300)
        screen = app.screen
        assert isinstance(screen, ApplyScreen)
        assert screen.verdict.startswith("fixed: "), screen.verdict
        assert [c.path for c in screen.changes] == ["calculator.py", "fast_add.py"]
        await pilot.press("down", "space")  # reject fast_add.py
        await pilot.press("enter")
        await wait_for(pilot, lambda: _dialog(app, 1), "the part's own dialog", deadline_s=300)
        part = app.screen
        assert isinstance(part, ApplyScreen) and [c.path for c in part.changes] == ["calculator.py"]
        assert part.verdict.startswith("not fixed: "), part.verdict
        assert tree(repo) == before  # judged, not applied yet
        await pilot.press("escape")
        await wait_for(pilot, lambda: not _dialog(app), "the dialog to close")

        await send(pilot, "/apply")  # the whole patch again: judged once, the same verdict
        await wait_for(pilot, lambda: _dialog(app, 2), "the apply dialog again", deadline_s=300)
        assert isinstance(app.screen, ApplyScreen) and app.screen.verdict.startswith("fixed: ")
        await pilot.press("enter")
        await wait_for(pilot, lambda: (repo / "fast_add.py").exists(), "the apply")
        await wait_for(pilot, lambda: "Applied to" in _notices(app), "the notice")
        assert "(fixed: " in _notices(app)
        await pilot.press("ctrl+q")
    assert "from fast_add import add" in (repo / "calculator.py").read_text()
