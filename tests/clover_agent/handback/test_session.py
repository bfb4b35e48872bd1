"""An interactive session's hand-back (what the TUI's ``/apply`` and ACP's offer use), with a real
sandbox, real pytest runs and a real git repository: judged as ``fix`` judges, a part judged again
on its own, and an apply that moves the start so what was not applied comes back with later work."""

from __future__ import annotations

import asyncio
from pathlib import Path

from clover_agent.handback.session import SessionHandBack
from clover_agent.handback.verdict import Verdict
from clover_agent.launch import sandbox_spec
from clover_agent.sandboxes.base import Put
from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.settings import Settings
from tests.git_repos import git
from tests.tui.helpers import calculator_repo

FIXED = "    return a + b"


def _fixed(text: str) -> str:
    return text.replace(
        '    """Return the sum of a and b."""\n    return a - b',
        '    """Return the sum of a and b."""\n' + FIXED,
    )


def test_a_part_is_judged_on_its_own_and_what_was_not_applied_comes_back(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    spec = sandbox_spec(Settings.load(), repo)
    source = (repo / "calculator.py").read_text()

    async def session() -> None:
        async with create_sandbox("local", spec) as sandbox:
            handback = SessionHandBack(sandbox, "local", spec, repo, tmp_path / "handback")
            await handback.start()
            await sandbox.put(
                [
                    Put("calculator.py", "file", 0o644, _fixed(source).encode()),
                    Put("NOTES.md", "file", 0o644, b"notes\n"),
                ]
            )
            offer = await handback.offer()
            assert offer is not None and sorted(offer.patch.files) == ["NOTES.md", "calculator.py"]
            # test_add failed at the start: it is the target, held out, and it passes now
            assert offer.judged.verdict == Verdict.FIXED, offer.verdict
            assert offer.verdict.startswith("fixed: the target passes")

            notes = await handback.part(offer, ["NOTES.md"])  # the part without the fix
            assert notes.patch.files == ["NOTES.md"]
            assert notes.judged.verdict == Verdict.NOT_FIXED, notes.verdict
            assert (repo / "calculator.py").read_text() == source  # judged, nothing written

            code = await handback.part(offer, ["calculator.py"])
            assert code.judged.verdict == Verdict.FIXED, code.verdict
            applied, how = await handback.apply(code)
            assert (applied.files, how) == (["calculator.py"], "disk") and not applied.merged
            assert FIXED in (repo / "calculator.py").read_text() and not (repo / "NOTES.md").exists()

            # the next offer: NOTES.md, never applied, and later work on the file applied before
            later = _fixed(source).replace('"""Return a minus b."""', '"""Return a minus b (a - b)."""')
            await sandbox.put([Put("calculator.py", "file", 0o644, later.encode())])
            again = await handback.offer()
            assert again is not None and sorted(again.patch.files) == ["NOTES.md", "calculator.py"]
            (calc,) = [f for f in again.files if f.path == "calculator.py"]
            assert calc.applied_before and "+" + FIXED not in calc.patch  # only what is new
            # nothing fails at the new start and the change adds no test: nothing shows it
            assert again.judged.verdict == Verdict.NOT_FIXED
            assert "no test shows the change" in again.verdict
            await handback.apply(again)  # the person's choice; their tree held what the apply left
            assert (repo / "calculator.py").read_text() == later and (
                repo / "NOTES.md"
            ).read_text() == "notes\n"

    asyncio.run(session())


def test_the_baseline_is_the_sessions_start_and_a_moved_tree_is_merged(tmp_path: Path) -> None:
    """The user fixes add in their own tree while the session works: the judging still starts from
    what the session started from (test_add failing there), and the apply merges the agent's change
    into the user's, which stays."""
    repo = calculator_repo(tmp_path)
    spec = sandbox_spec(Settings.load(), repo)
    source = (repo / "calculator.py").read_text()

    async def session() -> None:
        async with create_sandbox("local", spec) as sandbox:
            handback = SessionHandBack(sandbox, "local", spec, repo, tmp_path / "handback")
            await handback.start()
            mine = _fixed(source) + "\n# mine\n"
            (repo / "calculator.py").write_text(mine)
            git(repo, "commit", "-qam", "my own fix")
            await sandbox.put([Put("calculator.py", "file", 0o644, _fixed(source).encode())])
            offer = await handback.offer()
            assert offer is not None
            assert offer.judged.verdict == Verdict.FIXED, offer.verdict  # test_add: failing at the start
            applied, _ = await handback.apply(offer)
            assert applied.merged == {"calculator.py": ()}  # the same fix on both sides: no overlap
            assert (repo / "calculator.py").read_text() == mine  # yours, which already held the fix

    asyncio.run(session())


def test_what_is_pending_before_the_start_is_recorded_is_nothing(tmp_path: Path) -> None:
    """Before: quitting the TUI while the hand-back was still taking stock of the start raised
    "record_start first" out of the quit (seen under load); now nothing is pending then, and the
    change made afterwards is."""
    repo = calculator_repo(tmp_path)
    spec = sandbox_spec(Settings.load(), repo)

    async def session() -> tuple[list[str], list[str]]:
        async with create_sandbox("local", spec) as sandbox:
            handback = SessionHandBack(sandbox, "local", spec, repo, tmp_path / "handback")
            early = await handback.pending()
            await handback.start()
            await sandbox.put([Put("NOTES.md", "file", 0o644, b"notes\n")])
            return early, await handback.pending()

    early, later = asyncio.run(session())
    assert early == [] and later == ["NOTES.md"]
