"""The repository's git configuration as a sandbox gets it: without credentials.

One definition of "a credential shape" (:func:`holds_credential`), shared by the sandbox's copy of
``.git`` and the CI bot (which refuses a repository holding one). The sandbox's configuration files
are rewritten on the host from git's own parse of each file (includes not followed), keeping only
what git needs to read the repository and name its remotes and branches (:data:`KEPT`), with
user-info taken out of URLs. Everything else is left out: credential helpers and their settings,
HTTP headers and cookie files, ``url.<base>`` rewrites, includes, programs (``core.sshCommand``,
drivers, hooks). Files a configuration names that may hold credentials (an include, a ``store``
helper's file) are reported, for the copy to leave them behind. The user's files are only read.
"""

from __future__ import annotations

import itertools
import os
import posixpath
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

#: Seconds reading one configuration file may take.
_READ_TIMEOUT_S = 30.0

#: What the sandbox's configuration keeps: section → variable names (None: every variable).
# fmt: off
KEPT: dict[str, frozenset[str] | None] = {
    "core": frozenset([
        "repositoryformatversion", "filemode", "bare", "logallrefupdates", "ignorecase",
        "precomposeunicode", "symlinks", "autocrlf", "eol", "safecrlf", "quotepath",
        "sparsecheckout", "sparsecheckoutcone", "checkstat", "trustctime", "splitindex",
        "untrackedcache", "commentchar", "commentstring", "abbrev", "whitespace", "worktree",
        "protecthfs", "protectntfs", "bigfilethreshold", "compression", "loosecompression",
    ]),
    "extensions": None,  # how the repository is stored: git refuses it without them
    "index": None,
    "remote": frozenset([
        "url", "pushurl", "fetch", "push", "tagopt", "mirror", "prune", "prunetags", "promisor",
        "partialclonefilter", "skipdefaultupdate", "skipfetchall",
    ]),
    "branch": frozenset(["remote", "pushremote", "merge", "rebase", "description"]),
    "submodule": frozenset(["url", "active", "branch", "ignore", "fetchrecursesubmodules", "shallow"]),
    "user": frozenset(["name", "email"]),
}
# fmt: on

#: ``(section, variable)`` pairs that hold or lead to a credential whatever their subsection
#: (``http.<url>.extraheader`` too).
_SECRET_VARIABLES = frozenset(
    {
        ("http", "extraheader"),
        ("http", "cookiefile"),
        ("http", "sslkey"),
        ("http", "sslcert"),
        ("core", "askpass"),
        ("core", "sshcommand"),
        ("sendemail", "smtppass"),
        ("imap", "pass"),
    }
)
#: User-info in a URL: ``scheme://userinfo@`` (up to the last ``@`` before the path). No dot in the
#: scheme, so the one in a key (``url.https://...``) starts after the section's.
_USERINFO = re.compile(r"(?P<scheme>[a-z][a-z0-9+-]*)://(?P<userinfo>[^/?#\s]*)@", re.IGNORECASE)
#: Schemes whose user name alone can be a token (``https://TOKEN@github.com``); over SSH it is a login.
_TOKEN_SCHEMES = frozenset({"http", "https", "ftp", "ftps"})


def _is_credential(match: re.Match[str]) -> bool:
    return ":" in match["userinfo"] or match["scheme"].lower() in _TOKEN_SCHEMES


def strip_credentials(text: str) -> str:
    """``text`` with the credential user-info of every URL in it removed
    (``https://x:TOKEN@host/r`` → ``https://host/r``; ``ssh://git@host/r`` is kept)."""
    return _USERINFO.sub(lambda m: f"{m['scheme']}://" if _is_credential(m) else m[0], text)


def holds_credential(key: str, value: str | None) -> bool:
    """Whether the git setting ``key`` (``section[.subsection].variable``, any case) with ``value``
    (None: a bare boolean) holds a credential or leads to one: any ``credential.*`` setting, an
    HTTP header, cookie file or client key, ``core.askPass`` / ``core.sshCommand``, a stored mail
    password, an include (what it brings is not checked), a proxy with a user, or user-info in a
    URL anywhere in the key or value. An empty value turns a setting off, so it holds nothing."""
    section, name = key.split(".", 1)[0].lower(), key.rsplit(".", 1)[-1].lower()
    if any(_is_credential(m) for m in _USERINFO.finditer(key)):
        return True
    text = "true" if value is None else value
    if not text:
        return False
    return (
        section in ("credential", "include", "includeif")
        or (section, name) in _SECRET_VARIABLES
        or (name == "proxy" and "@" in text)
        or any(_is_credential(m) for m in _USERINFO.finditer(text))
    )


def _git_environment() -> dict[str, str]:
    """Git reading one file: no system or global configuration, no ``GIT_*`` of this process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, LC_ALL="C")
    return env


def read_config(path: Path) -> list[tuple[str, str | None]] | None:
    """The settings of the one configuration file ``path`` as git parses it, includes not followed:
    ``(key, value)`` in file order (section and variable lower-cased, as git prints them; value
    None for a bare boolean), or None when it is not a regular file git can read."""
    if not path.is_file():
        return None  # a FIFO or device behind a symlink would block the read
    try:
        listed = subprocess.run(
            ["git", "config", "--file", str(path), "--no-includes", "--list", "-z"],
            capture_output=True,
            env=_git_environment(),
            cwd="/",
            timeout=_READ_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if listed.returncode != 0:
        return None
    entries: list[tuple[str, str | None]] = []
    for entry in listed.stdout.decode("utf-8", "surrogateescape").split("\0"):
        if entry:
            key, newline, value = entry.partition("\n")
            entries.append((key, value if newline else None))
    return entries


def is_git_dir(path: Path) -> bool:
    """Whether ``path`` looks like a git directory (a ``HEAD`` and objects or a ``commondir``)."""
    return (path / "HEAD").is_file() and ((path / "objects").is_dir() or (path / "commondir").is_file())


def is_config_file(path: Path) -> bool:
    """Whether ``path`` is a configuration file of a git directory: ``config``, or a
    ``config.worktree`` (linked worktrees and submodules' git directories included)."""
    return path.name in ("config", "config.worktree") and is_git_dir(path.parent)


#: Folders of a git directory that never hold its configuration files.
_NO_CONFIG_BELOW = frozenset({"objects", "refs", "logs", "hooks", "info", "lfs", "rr-cache"})


def config_files(git_dir: Path) -> list[Path]:
    """Every configuration file of ``git_dir`` and of the git directories inside it (linked
    worktrees under ``worktrees/``, submodules under ``modules/``)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(git_dir):
        dirnames[:] = sorted(d for d in dirnames if d not in _NO_CONFIG_BELOW)
        found += [Path(dirpath) / name for name in sorted(filenames) if is_config_file(Path(dirpath) / name)]
    return found


@dataclass
class SandboxConfig:
    """A configuration file rewritten for the sandbox."""

    text: bytes  # the file the sandbox gets
    named: list[Path]  # files it names that may hold credentials (includes, a store helper's file)
    left_out: list[str]  # the keys left out, or whose URL lost its user-info


def sandbox_config(path: Path, rel: str) -> SandboxConfig:
    """The sandbox's version of the configuration file ``path`` (at ``rel`` in the workspace):
    the :data:`KEPT` settings with URLs free of credentials; a file git cannot read becomes empty."""
    entries = read_config(path)
    if entries is None:
        return SandboxConfig(b"", [], ["(unreadable)"])
    kept: list[tuple[str, str | None]] = []
    named, left_out = [], []
    for key, value in entries:
        section, name = key.split(".", 1)[0], key.rsplit(".", 1)[-1]
        if section in ("include", "includeif") and name == "path" and value:
            named.append(_host_path(path.parent, value))
        if section == "credential" and name == "helper" and value:
            named += [_host_path(path.parent.parent, f) for f in _store_files(value)]
        if name in ("url", "pushurl") and value is not None and strip_credentials(value) != value:
            value = strip_credentials(value)
            left_out.append(key)
        if _kept(section, name, key, value, rel):
            kept.append((key, value))
        else:
            left_out.append(key)
    return SandboxConfig(write_config(kept), named, left_out)


def _kept(section: str, name: str, key: str, value: str | None, rel: str) -> bool:
    allowed = KEPT.get(section, frozenset())
    if (allowed is not None and name not in allowed) or holds_credential(key, value):
        return False
    if (section, name) == ("core", "worktree"):  # only one inside the copy: never the user's tree
        return value is not None and not value.startswith(("/", "~")) and not _outside(rel, value)
    return True


def _outside(rel: str, relative: str) -> bool:
    """Whether ``relative``, taken from the folder of the workspace file ``rel``, leaves the workspace."""
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(rel), relative))
    return joined == ".." or joined.startswith("../")


def _host_path(base: Path, value: str) -> Path:
    """The host path a setting names (``~/`` expanded; a relative one taken from ``base``)."""
    target = Path(os.path.expanduser(value)) if value.startswith("~/") else Path(value)
    return Path(os.path.normpath(base / target))


def _store_files(helper: str) -> list[str]:
    """The files a ``store`` credential helper keeps credentials in (``store --file=F``)."""
    try:
        words = shlex.split(helper)
    except ValueError:
        return []
    if not words or words[0] not in ("store", "git-credential-store"):
        return []
    files = [w.removeprefix("--file=") for w in words[1:] if w.startswith("--file=")]
    return files + [after for before, after in itertools.pairwise(words) if before == "--file"]


def _quote(text: str, *, value: bool) -> str:
    """``text`` for inside double quotes: a subsection knows only ``\\`` and ``\"``; a value also
    ``\\n``, ``\\t`` and ``\\b``."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    if value:
        escaped = escaped.replace("\n", "\\n").replace("\t", "\\t").replace("\b", "\\b")
    return escaped


def write_config(entries: list[tuple[str, str | None]]) -> bytes:
    """A configuration file holding ``entries`` (as :func:`read_config` gives them) in order, every
    value quoted, so git reads exactly these back."""
    lines, current = [], None
    for key, value in entries:
        section, _, rest = key.partition(".")
        subsection, _, name = rest.rpartition(".")
        header = (section, subsection if "." in rest else None)
        if header != current:
            current = header
            lines.append(
                f"[{section}]" if header[1] is None else f'[{section} "{_quote(subsection, value=False)}"]'
            )
        lines.append(f"\t{name}" if value is None else f'\t{name} = "{_quote(value, value=True)}"')
    return "".join(line + "\n" for line in lines).encode("utf-8", "surrogateescape")
