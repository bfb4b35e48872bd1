"""Signed records: a run's or a session's files carry an HMAC made with a key only this user's
clover-agent holds, so a record that arrives with the repository or from a workspace (a forged run
folder under ``.clover/runs``) is told apart from one this user's runs wrote, and refused.

The key (:class:`RecordKey`) lives in the user's own folder (``Settings.state``, never in a
repository), made on first use, readable by the user alone. ``record.mac`` in the record's folder
holds, for each signed file, its length and ``HMAC-SHA256(key, kind, id, name, bytes)``. The
trajectory grows one event at a time: :class:`Sealer` keeps its MAC running and rewrites
``record.mac`` after each line, so a run killed at any point stays verifiable. Other files are
signed whole when written (:meth:`RecordKey.sign`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

from clover_agent.errors import UsageError

MAC_FILE = "record.mac"
_VERSION = 1


class RecordKey:
    """The user's signing key for ``kind`` records (``"run"``, ``"session"``)."""

    def __init__(self, secret: bytes, kind: str = "run") -> None:
        self._secret = secret
        self.kind = kind

    @classmethod
    def load(cls, path: Path, kind: str = "run") -> RecordKey:
        """The key at ``path``, made (random, mode 0600, its folder 0700) when missing."""
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
        try:
            text = path.read_text(encoding="ascii").strip()
            secret = bytes.fromhex(text)
        except (OSError, ValueError) as exc:
            raise UsageError(
                f"{path}: the key that signs clover-agent's records cannot be read ({exc})"
            ) from None
        if len(secret) < 32:
            raise UsageError(f"{path}: the key that signs clover-agent's records is too short; remove it")
        return cls(secret, kind)

    def for_kind(self, kind: str) -> RecordKey:
        return RecordKey(self._secret, kind)

    def _mac(self, record_id: str, name: str) -> hmac.HMAC:
        label = f"clover-agent record v{_VERSION}\0{self.kind}\0{record_id}\0{name}\0".encode()
        return hmac.new(self._secret, label, hashlib.sha256)

    def sign(self, folder: Path, name: str) -> None:
        """Sign ``folder/name`` as it is now (its MAC replaces the one ``record.mac`` held)."""
        data = (folder / name).read_bytes()
        mac = self._mac(folder.name, name)
        mac.update(data)
        _write_entry(folder, name, len(data), mac.hexdigest())

    def sealer(self, folder: Path, name: str) -> Sealer:
        """A running MAC over ``folder/name``, a file that only grows (its bytes so far included)."""
        return Sealer(self, folder, name)

    def problem(self, folder: Path, names: tuple[str, ...]) -> str | None:
        """Why ``folder``'s files ``names`` (those that exist) were not all written by this user's
        clover-agent; None when each one's bytes are exactly what was signed."""
        if folder.is_symlink():  # it would be another folder's record, under this name
            return "the folder is a symlink"
        try:
            entries = json.loads((folder / MAC_FILE).read_text(encoding="utf-8"))["files"]
        except FileNotFoundError:
            return f"it has no {MAC_FILE} (the signature clover-agent writes with every record)"
        except (OSError, ValueError, KeyError, TypeError):
            return f"its {MAC_FILE} is not a signature clover-agent wrote"
        for name in names:
            path = folder / name
            if not path.exists() and not path.is_symlink():
                continue
            entry = entries.get(name) if isinstance(entries, dict) else None
            if not isinstance(entry, dict) or path.is_symlink() or not path.is_file():
                return f"{name} is not signed"
            data = path.read_bytes()
            mac = self._mac(folder.name, name)
            mac.update(data)
            if len(data) != entry.get("bytes") or not hmac.compare_digest(
                mac.hexdigest(), str(entry.get("mac"))
            ):
                return f"{name} is not what this user's clover-agent wrote (its signature does not match)"
        return None

    def check(self, folder: Path, names: tuple[str, ...], what: str) -> None:
        """:class:`UsageError` unless :meth:`problem` finds none; ``what`` names the record."""
        problem = self.problem(folder, names)
        if problem is not None:
            raise UsageError(
                f"{what} in {folder} was not written by your clover-agent: {problem}. It is not used "
                "(a record that arrived with the repository or from a workspace could say anything)."
            )


class Sealer:
    """Keeps ``record.mac``'s entry for a growing file current (see the module docstring)."""

    def __init__(self, key: RecordKey, folder: Path, name: str) -> None:
        self.folder, self.name = folder, name
        self._mac = key._mac(folder.name, name)
        path = folder / name
        self._length = 0
        if path.is_file():
            data = path.read_bytes()
            self._mac.update(data)
            self._length = len(data)

    def add(self, data: bytes) -> None:
        """``data`` was appended to the file: sign the file as it now is."""
        self._mac.update(data)
        self._length += len(data)
        _write_entry(self.folder, self.name, self._length, self._mac.copy().hexdigest())


def _write_entry(folder: Path, name: str, length: int, mac: str) -> None:
    path = folder / MAC_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        files = data["files"] if isinstance(data, dict) and isinstance(data.get("files"), dict) else {}
    except (OSError, ValueError):
        files = {}
    files[name] = {"bytes": length, "mac": mac}
    temporary = folder / (MAC_FILE + ".tmp")
    temporary.write_text(json.dumps({"version": _VERSION, "files": files}, indent=1) + "\n", encoding="utf-8")
    temporary.replace(path)


def state_dir(repo: Path, name: str, what: str) -> Path:
    """``<repo>/.clover/<name>`` (made when missing), git-ignored by a ``.gitignore`` inside it:
    where clover-agent keeps ``what`` (run records, TUI sessions) for that repository.

    Refused (:class:`UsageError`) when ``.clover``, the folder or its ``.gitignore`` is a symlink or
    of the wrong kind: a repository that commits one would make the records land wherever it points.
    Every ``.clover`` folder clover-agent writes is made here."""
    for part in (repo / ".clover", repo / ".clover" / name):
        if part.is_symlink() or (part.exists() and not part.is_dir()):
            kind = "a symlink" if part.is_symlink() else "not a folder"
            raise UsageError(
                f"{part} is {kind}: clover-agent keeps its {what} there and will not write through it "
                "(they could land outside the repository). Remove it, or pass another --repo."
            )
    path = repo / ".clover" / name
    path.mkdir(parents=True, exist_ok=True)
    ignore = path / ".gitignore"
    if ignore.is_symlink() or (os.path.lexists(ignore) and not ignore.is_file()):
        raise UsageError(f"{ignore} is not a plain file: clover-agent will not write through it. Remove it.")
    if not ignore.exists():
        fd = os.open(ignore, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(f"# clover-agent {what}; not part of the project\n*\n")
    return path
