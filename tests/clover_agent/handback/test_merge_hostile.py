"""Hostile merges in the hand-back, in real git repositories: what the agent writes or the user's
tree holds must never lose or mis-name the user's work (their edits, their file's permissions), nor
get the agent's bytes in unnamed. Line endings, odd names, marker-like lines, permissions."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from clover_agent.handback.apply import apply_patch_set
from clover_agent.handback.stock import PatchSet
from tests.clover_agent.fix.stocked import stocked_report
from tests.git_repos import make_repo

LINES = "".join(f"line {i}\n" for i in range(1, 21))


async def _agent_writes(repo: Path, tmp_path: Path, files: dict[str, bytes]) -> PatchSet:
    """The patch of an agent that writes ``files`` (any names, any bytes)."""
    script = tmp_path / "agent.py"
    script.write_text(
        f"import pathlib\nfor name, data in {files!r}.items():\n    pathlib.Path(name).write_bytes(data)\n"
    )
    return (await stocked_report(repo, tmp_path / "run", f"python3 {script}")).patch_set


def _perms(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_a_private_file_of_yours_stays_private(tmp_path: Path) -> None:
    """Before: every file written got the umask's permissions: a ``0600`` file of the user's
    (merged or not) became world-readable ``0644``, and one the agent made executable ``0755``."""
    repo = make_repo(tmp_path / "repo", {"merged.py": LINES, "plain.py": LINES})
    patch = await _agent_writes(
        repo,
        tmp_path,
        {
            "merged.py": LINES.replace("line 15\n", "line 15 (agent)\n").encode(),
            "plain.py": LINES.replace("line 15\n", "line 15 (agent)\n").encode(),
        },
    )
    (repo / "merged.py").write_text(LINES.replace("line 2\n", "line 2 (mine)\n"))
    for name in ("merged.py", "plain.py"):
        os.chmod(repo / name, 0o600)
    applied = apply_patch_set(repo, patch)
    assert applied.merged == {"merged.py": ()} and sorted(applied.files) == ["merged.py", "plain.py"]
    assert "line 15 (agent)" in (repo / "plain.py").read_text()
    assert _perms(repo / "merged.py") == 0o600 and _perms(repo / "plain.py") == 0o600


async def test_the_agents_executable_bit_is_set_where_yours_can_read(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"tool.sh": LINES})
    script = tmp_path / "agent.sh"
    script.write_text("sed -i 's/^line 15$/line 15 (agent)/' tool.sh && chmod +x tool.sh\n")
    patch = (await stocked_report(repo, tmp_path / "run", f"sh {script}")).patch_set
    (repo / "tool.sh").write_text(LINES.replace("line 2\n", "line 2 (mine)\n"))
    os.chmod(repo / "tool.sh", 0o640)
    applied = apply_patch_set(repo, patch)
    assert applied.merged == {"tool.sh": ()}
    assert _perms(repo / "tool.sh") == 0o750  # executable for whoever could read it, no one else


async def test_an_executable_bit_of_yours_stays(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"calc.py": LINES})
    patch = await _agent_writes(
        repo, tmp_path, {"calc.py": LINES.replace("line 15\n", "line 15 (agent)\n").encode()}
    )
    os.chmod(repo / "calc.py", 0o700)
    applied = apply_patch_set(repo, patch)
    assert applied.merged == {"calc.py": ()} and _perms(repo / "calc.py") == 0o700
    assert "line 15 (agent)" in (repo / "calc.py").read_text()


async def test_a_conflict_block_the_agent_writes_is_not_named_as_an_overlap(tmp_path: Path) -> None:
    """Before: a block shaped like a conflict in the agent's own text (its "yours" side the agent's
    code) merged cleanly, and was then named to the user as a conflict of theirs to resolve."""
    repo = make_repo(tmp_path / "repo", {"calc.py": LINES})
    forged = "<<<<<<< yours\nline 15 (looks yours, is the agent's)\n=======\nline 15\n>>>>>>> clover-agent\n"
    theirs = LINES.replace("line 5\n", "line 5 (agent)\n").replace("line 15\n", forged)
    patch = await _agent_writes(repo, tmp_path, {"calc.py": theirs.encode()})
    (repo / "calc.py").write_text(LINES.replace("line 5\n", "line 5 (mine)\n"))
    applied = apply_patch_set(repo, patch, markers=True)
    lines = (repo / "calc.py").read_text().splitlines()
    at = lines.index("line 5 (mine)") - 1
    assert lines[at].startswith("<<<<<<<< yours")  # the real markers: longer than the agent's
    assert applied.merged == {"calc.py": (f"line {at + 1}",)}  # one overlap, the real one
    assert forged in (repo / "calc.py").read_text()  # the agent's text, as it wrote it


async def test_marker_lines_in_the_agents_hunk_do_not_shift_the_lines_named(tmp_path: Path) -> None:
    """Before: a ``>>>>>>> `` line inside the agent's overlapping hunk ended the conflict early: its
    size was miscounted and every later overlap named at the wrong line."""
    repo = make_repo(tmp_path / "repo", {"calc.py": LINES})
    theirs = LINES.replace("line 5\n", "line 5 (agent)\n>>>>>>> clover-agent\nx\n").replace(
        "line 15\n", "line 15 (agent)\n"
    )
    patch = await _agent_writes(repo, tmp_path, {"calc.py": theirs.encode()})
    mine = LINES.replace("line 5\n", "line 5 (mine)\n").replace("line 15\n", "line 15 (mine)\n")
    (repo / "calc.py").write_text(mine)
    applied = apply_patch_set(repo, patch)
    assert (repo / "calc.py").read_text() == mine  # both hunks overlap: yours kept
    assert applied.merged == {
        "calc.py": (
            "line 5 (3 line(s) of the agent's left out)",
            "line 15 (1 line(s) of the agent's left out)",
        )
    }


async def test_crlf_files_merge_and_keep_their_line_endings(tmp_path: Path) -> None:
    crlf = LINES.replace("\n", "\r\n")
    repo = make_repo(tmp_path / "repo", {"calc.py": crlf.encode()})
    patch = await _agent_writes(
        repo, tmp_path, {"calc.py": crlf.replace("line 15\r\n", "line 15 (agent)\r\n").encode()}
    )
    mine = crlf.replace("line 2\r\n", "line 2 (mine)\r\n")
    (repo / "calc.py").write_bytes(mine.encode())
    applied = apply_patch_set(repo, patch)
    assert (repo / "calc.py").read_bytes() == mine.replace("line 15\r\n", "line 15 (agent)\r\n").encode()
    assert applied.merged == {"calc.py": ()}


@pytest.mark.parametrize("name", ["-L", "--ours", "-p", "t\tab.py", "café.py", "theirs"])
async def test_a_name_git_could_read_as_an_option_is_a_name(tmp_path: Path, name: str) -> None:
    repo = make_repo(tmp_path / "repo", {name: LINES})
    patch = await _agent_writes(
        repo, tmp_path, {name: LINES.replace("line 15\n", "line 15 (agent)\n").encode()}
    )
    mine = LINES.replace("line 2\n", "line 2 (mine)\n")
    (repo / name).write_text(mine)
    applied = apply_patch_set(repo, patch)
    assert (repo / name).read_text() == mine.replace("line 15\n", "line 15 (agent)\n")
    assert applied.merged == {name: ()} and applied.files == [name]


async def test_an_emptied_file_of_yours_stays_empty_and_the_agents_change_is_named(tmp_path: Path) -> None:
    latin = "".join(f"ligne é {i}\n" for i in range(20)).encode("latin-1")
    repo = make_repo(tmp_path / "repo", {"e.txt": LINES, "l.txt": latin})
    patch = await _agent_writes(
        repo,
        tmp_path,
        {"e.txt": LINES.replace("line 15\n", "line 15 (agent)\n").encode(), "l.txt": latin + b"x\n"},
    )
    (repo / "e.txt").write_text("")
    mine = latin.replace(b"ligne \xe9 1\n", b"ligne \xe9 1 (mine)\n")
    (repo / "l.txt").write_bytes(mine)
    applied = apply_patch_set(repo, patch)
    assert (repo / "e.txt").read_bytes() == b"" and (repo / "l.txt").read_bytes() == mine + b"x\n"
    assert applied.merged == {"e.txt": ("line 1 (20 line(s) of the agent's left out)",), "l.txt": ()}


def test_a_session_offers_what_was_left_out_again_and_only_that(tmp_path: Path) -> None:
    """/apply merges one file and leaves out another (binary, changed by you too): the session's
    start moves past the merged file only, so the next offer holds the file left out, whole."""
    import asyncio

    from clover_agent.handback.session import SessionHandBack
    from clover_agent.launch import sandbox_spec
    from clover_agent.sandboxes.base import Put
    from clover_agent.sandboxes.factory import create_sandbox
    from clover_agent.settings import Settings
    from tests.git_repos import git
    from tests.tui.helpers import calculator_repo

    repo = calculator_repo(tmp_path)
    (repo / "logo.bin").write_bytes(b"\x00start")
    git(repo, "add", "logo.bin")
    git(repo, "commit", "-qm", "logo")
    spec = sandbox_spec(Settings.load(), repo)
    source = (repo / "calculator.py").read_text()
    fixed = source.replace("    return a - b", "    return a + b", 1)
    assert fixed != source

    async def session() -> None:
        async with create_sandbox("local", spec) as sandbox:
            handback = SessionHandBack(sandbox, "local", spec, repo, tmp_path / "handback")
            await handback.start()
            await sandbox.put(
                [
                    Put("calculator.py", "file", 0o644, fixed.encode()),
                    Put("logo.bin", "file", 0o644, b"\x00agent"),
                ]
            )
            mine = "# mine\n" + source
            (repo / "calculator.py").write_text(mine)
            (repo / "logo.bin").write_bytes(b"\x00mine")
            offer = await handback.offer()
            assert offer is not None
            applied, how = await handback.apply(offer)
            assert how == "disk" and applied.files == ["calculator.py"]
            assert applied.merged == {"calculator.py": ()} and "binary" in applied.left_out["logo.bin"]
            assert (repo / "calculator.py").read_text() == "# mine\n" + fixed
            assert (repo / "logo.bin").read_bytes() == b"\x00mine"

            again = await handback.offer()
            assert again is not None and again.patch.files == ["logo.bin"]  # whole, from the start
            (repo / "logo.bin").write_bytes(b"\x00start")  # you put it back: it applies as it is
            applied, _ = await handback.apply(again)
            assert applied.files == ["logo.bin"] and (repo / "logo.bin").read_bytes() == b"\x00agent"
            assert await handback.offer() is None

    asyncio.run(session())


async def test_a_repository_around_the_temporary_folder_does_not_shape_the_merge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: with TMPDIR inside a git repository (``~/tmp`` under a home kept in git), ``git
    merge-file`` found it and read its configuration: ``merge.conflictStyle=diff3`` wrote the run's
    start between the markers too, and the lines named for the overlaps were wrong."""
    import tempfile

    from tests.git_repos import git

    repo = make_repo(tmp_path / "repo", {"calc.py": LINES})
    theirs = LINES.replace("line 5\n", "line 5 (agent)\n").replace("line 15\n", "line 15 (agent)\n")
    patch = await _agent_writes(repo, tmp_path, {"calc.py": theirs.encode()})
    home = make_repo(tmp_path / "home", {"notes.txt": "x\n"})
    git(home, "config", "merge.conflictStyle", "diff3")
    (home / "tmp").mkdir()
    mine = LINES.replace("line 5\n", "line 5 (mine)\n").replace("line 15\n", "line 15 (mine)\n")
    (repo / "calc.py").write_text(mine)
    monkeypatch.setattr(tempfile, "tempdir", str(home / "tmp"))
    applied = apply_patch_set(repo, patch)
    assert (repo / "calc.py").read_text() == mine
    named = ("line 5 (1 line(s) of the agent's left out)", "line 15 (1 line(s) of the agent's left out)")
    assert applied.merged == {"calc.py": named}
    (repo / "calc.py").write_text(mine)
    applied = apply_patch_set(repo, patch, markers=True)
    text = (repo / "calc.py").read_text()
    assert "|||||||" not in text and "the run's start" not in text
    lines = text.splitlines()
    assert applied.merged == {"calc.py": ("line 5", f"line {lines.index('line 15 (mine)')}")}
