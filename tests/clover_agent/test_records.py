"""Signed records: the user's key, made once and private, and what a changed record looks like."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from clover_agent.agent.records import MAC_FILE, RecordKey
from clover_agent.agent.trajectory import TrajectoryWriter
from clover_agent.cli.options import record_key
from clover_agent.errors import UsageError
from clover_agent.events import SandboxProgress
from clover_agent.session.store import SessionInfo, list_sessions, load_session, session_dir, write_info
from clover_agent.settings import Settings


def test_the_key_is_made_once_readable_by_the_user_alone(tmp_path: Path) -> None:
    path = tmp_path / "state" / "record.key"
    first = RecordKey.load(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    folder = tmp_path / "run-1"
    folder.mkdir()
    (folder / "summary.json").write_text("{}\n")
    first.sign(folder, "summary.json")
    assert RecordKey.load(path).problem(folder, ("summary.json",)) is None  # the same key, read back
    assert RecordKey.load(tmp_path / "other.key").problem(folder, ("summary.json",)) is not None


def test_a_growing_trajectory_stays_signed_and_any_change_is_seen(tmp_path: Path) -> None:
    key = RecordKey.load(tmp_path / "record.key")
    run = tmp_path / "20260101-000000-abcdef"
    writer = TrajectoryWriter(run / "trajectory.jsonl", key=key)
    writer(SandboxProgress(message="one"))
    assert key.problem(run, ("trajectory.jsonl",)) is None  # signed after each line (a kill keeps it)
    writer(SandboxProgress(message="two"))
    writer.close()
    writer = TrajectoryWriter(run / "trajectory.jsonl", key=key)  # a resumed segment appends
    writer(SandboxProgress(message="three"))
    writer.close()
    assert key.problem(run, ("trajectory.jsonl", "summary.json")) is None  # a missing file: not read
    original = (run / "trajectory.jsonl").read_bytes()
    for changed in (original + b'{"type": "sandbox_progress", "time": 1, "message": "x"}\n', original[:-5],
                    original.replace(b"two", b"owt")):  # fmt: skip
        (run / "trajectory.jsonl").write_bytes(changed)
        assert "not what this user's clover-agent wrote" in (key.problem(run, ("trajectory.jsonl",)) or "")
    (run / "trajectory.jsonl").write_bytes(original)
    copy = tmp_path / "20260101-000000-ffffff"  # the same bytes under another run id
    copy.mkdir()
    for name in ("trajectory.jsonl", MAC_FILE):
        (copy / name).write_bytes((run / name).read_bytes())
    assert key.problem(copy, ("trajectory.jsonl",)) is not None
    (tmp_path / "20260102-000000-abcdef").symlink_to(run)  # a real record, seen under a link
    assert (
        key.problem(tmp_path / "20260102-000000-abcdef", ("trajectory.jsonl",)) == "the folder is a symlink"
    )
    (run / MAC_FILE).unlink()
    assert "has no record.mac" in (key.problem(run, ("trajectory.jsonl",)) or "")


def test_the_key_is_never_inside_the_repository(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    settings = Settings.load(
        {"CLOVER_CONFIG": str(tmp_path / "none.toml"), "CLOVER_STATE": str(repo / "state")}
    )
    with pytest.raises(UsageError, match="inside the repository"):
        record_key(settings, repo)
    assert not (repo / "state").exists()


def test_a_tui_session_folder_not_written_by_the_user_is_neither_listed_nor_resumed(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    key = RecordKey.load(tmp_path / "record.key", "session")
    mine = session_dir(repo, "20260101-000000-aaaaaa")
    mine.mkdir()
    writer = TrajectoryWriter(mine / "trajectory.jsonl", key=key)
    writer(SandboxProgress(message="hello"))
    writer.close()
    write_info(mine, SessionInfo(mine.name, str(repo), title="mine", updated=1.0), key)
    forged = session_dir(repo, "20260101-000000-bbbbbb")  # as an agent or a repository would ship it
    forged.mkdir()
    for name in ("trajectory.jsonl", "session.json"):
        (forged / name).write_bytes(
            (mine / name).read_bytes().replace(mine.name.encode(), forged.name.encode())
        )
    assert [s.session_id for s in list_sessions(repo, key)] == [mine.name]
    assert load_session(repo, mine.name, key).info.title == "mine"
    with pytest.raises(UsageError, match=f"session {forged.name} in .* was not written by your clover-agent"):
        load_session(repo, forged.name, key)
    # A run's signature is not a session's: the same key signs each kind apart.
    with pytest.raises(UsageError, match="not written by your clover-agent"):
        load_session(repo, mine.name, key.for_kind("run"))
