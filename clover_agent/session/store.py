"""Saved TUI sessions: ``<repo>/.clover/sessions/<id>/`` with the trajectory and a small index file.

``trajectory.jsonl`` holds every event of the session as it happened (written before the agent
goes on), so a session killed at any point can be resumed from it: the conversation, the budget
spent and the workspace patch are rebuilt by :func:`clover_agent.agent.trajectory.load_trajectory`,
and the transcript is redrawn from the same events. ``session.json`` holds what the picker lists
(title, times, requests) and the prompt's unsent draft, and is rewritten after each request
and on quitting. Both are signed with the user's key
(:mod:`clover_agent.agent.records`): a session folder this user's clover-agent did not write is
neither listed nor resumed.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from clover_agent.agent.records import RecordKey, state_dir
from clover_agent.agent.trajectory import (
    TRAJECTORY_FILE,
    ResumeState,
    TrajectoryError,
    load_trajectory,
    read_events,
)
from clover_agent.errors import UsageError
from clover_agent.events import Event
from clover_agent.session import events as _session_events  # noqa: F401 - registers the TUI's event types

SESSIONS_DIR = Path(".clover") / "sessions"
INDEX_FILE = "session.json"
#: The files of a session folder that are read back, and so signed.
SESSION_FILES = (TRAJECTORY_FILE, INDEX_FILE)


@dataclass
class SessionInfo:
    """What ``session.json`` holds."""

    session_id: str
    repo: str
    title: str = ""
    created: float = 0.0
    updated: float = 0.0
    requests: int = 0
    backend: str = ""
    draft: str = ""  # the prompt's unsent text when the app quit, put back on resume
    policy: str = ""  # the policy in force when it was last saved ("": not recorded)

    @property
    def shown_title(self) -> str:
        return self.title or "(no request yet)"


def new_session_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def sessions_dir(repo: Path) -> Path:
    """``<repo>/.clover/sessions`` (:func:`clover_agent.agent.records.state_dir`: never through a symlink)."""
    return state_dir(repo, SESSIONS_DIR.name, "TUI sessions (trajectories)")


def session_dir(repo: Path, session_id: str) -> Path:
    return sessions_dir(repo) / session_id


def write_info(folder: Path, info: SessionInfo, key: RecordKey | None) -> None:
    """Write ``session.json`` (signed with ``key``; None: unsigned, never resumed)."""
    temporary = folder / (INDEX_FILE + ".tmp")
    temporary.write_text(json.dumps(asdict(info), indent=2) + "\n", encoding="utf-8")
    temporary.replace(folder / INDEX_FILE)
    if key is not None:
        key.sign(folder, INDEX_FILE)


def read_info(folder: Path) -> SessionInfo | None:
    """The index of a session folder; None when it has none or it is damaged."""
    try:
        data = json.loads((folder / INDEX_FILE).read_text(encoding="utf-8"))
        return SessionInfo(**{k: v for k, v in data.items() if k in SessionInfo.__dataclass_fields__})
    except (OSError, ValueError, TypeError):
        return None


def list_sessions(repo: Path, key: RecordKey) -> list[SessionInfo]:
    """The saved sessions of ``repo`` that have a trajectory and that ``key`` signed, newest first."""
    root = repo / SESSIONS_DIR
    if not root.is_dir():
        return []
    found = []
    for folder in root.iterdir():
        signed = (folder / TRAJECTORY_FILE).is_file() and key.problem(folder, SESSION_FILES) is None
        info = read_info(folder) if signed else None
        if info is not None:
            found.append(info)
    return sorted(found, key=lambda info: info.updated, reverse=True)


@dataclass
class SavedSession:
    """A session read back for resuming: its index, its events (to redraw) and its agent state."""

    info: SessionInfo
    events: list[Event]
    state: ResumeState | None  # None when no request ever ran


def load_session(repo: Path, session_id: str, key: RecordKey) -> SavedSession:
    """Read a saved session ``key`` signed; every reason it cannot be resumed is a
    :class:`UsageError`."""
    folder = repo / SESSIONS_DIR / session_id
    trajectory = folder / TRAJECTORY_FILE
    if "/" in session_id or session_id in ("", ".", "..") or not trajectory.is_file():
        known = ", ".join(s.session_id for s in list_sessions(repo, key)[:3]) or "there are none"
        raise UsageError(
            f"--resume {session_id}: no saved session of that id in {repo / SESSIONS_DIR} ({known})"
        )
    key.check(folder, SESSION_FILES, f"session {session_id}")
    info = read_info(folder)
    if info is None:
        raise UsageError(f"cannot resume session {session_id}: its {INDEX_FILE} is damaged")
    try:
        events = read_events(trajectory)
        state = load_trajectory(trajectory) if any(e.type == "run_started" for e in events) else None
    except (TrajectoryError, ValueError) as exc:
        raise UsageError(f"cannot resume session {session_id}: its trajectory is damaged: {exc}") from None
    return SavedSession(info, events, state)
