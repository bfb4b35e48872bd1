"""Real git repositories for the tests: :func:`git` runs one git command in a repository (with a
fixed identity, so commits need no global git config) and :func:`make_repo` writes files and commits
them."""

from __future__ import annotations

import subprocess
from pathlib import Path

IDENTITY = ("-c", "user.name=Test", "-c", "user.email=test@example.com")


def git(repo: Path, *args: str) -> str:
    """The output of ``git args...`` run in ``repo``; a failing command raises."""
    return subprocess.run(
        ["git", *IDENTITY, "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


def make_repo(root: Path, files: dict[str, str | bytes]) -> Path:
    """A git repository at ``root`` (branch ``main``) with ``files`` committed."""
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "initial")
    return root


#: Every credential :func:`store_credentials` leaves in a repository (none may reach a sandbox).
STORED_SECRETS = (
    "SECRET_HEADER_A", "SECRET_HEADER_B", "ghp_SECRET_URL", "SECRET_PUSH_TOKEN", "SECRET_HELPER",
    "SECRET_USER", "SECRET_STORE", "SECRET_IN_STORE_FILE", "SECRET_INCLUDED", "SECRET_INNER",
    "SECRET_INSTEADOF", "SECRET_COOKIES", "SECRET_PROXY", "SECRET_SSH_KEY", "SECRET_ASKPASS",
    "SECRET_WORKTREE",
)  # fmt: skip

_CREDENTIALS = """\
[http]
\textraheader = AUTHORIZATION: basic SECRET_HEADER_A
[HTTP "https://github.com/"]
\tExtraHeader = AUTHORIZATION: bearer SECRET_HEADER_B
[remote "origin"]
\turl = https://x-access-token:ghp_SECRET_URL@github.com/o/r.git
\tpushurl = https://SECRET_PUSH_TOKEN@github.com/o/r.git
\tfetch = +refs/heads/*:refs/remotes/origin/*
[branch "main"]
\tremote = origin
\tmerge = refs/heads/main
[credential]
\thelper = !echo password=SECRET_HELPER
\tUserName = SECRET_USER
[Credential "https://example.com"]
\tHelper = store --file=.git/SECRET_STORE
[include]
\tpath = {outside}
[includeIf "gitdir:/"]
\tpath = inner.inc
[url "https://SECRET_INSTEADOF@github.com/"]
\tinsteadOf = https://github.com/
[http]
\tcookieFile = /tmp/SECRET_COOKIES
\tproxy = http://proxyuser:SECRET_PROXY@proxy.example:3128
[Core]
\tSSHCommand = ssh -i /tmp/SECRET_SSH_KEY
\taskPass = /tmp/SECRET_ASKPASS
"""


def store_credentials(repo: Path, outside: Path) -> None:
    """Leave every shape of stored git credential in ``repo``'s configuration (each secret is one
    of :data:`STORED_SECRETS`): HTTP headers (``[http]`` and a mixed-case ``[HTTP "url"]``), a token
    in the remote URLs, inline and storing credential helpers (the store's file in ``.git``), an
    include of ``outside`` (a file it writes holding a token) and of ``.git/inner.inc``, a
    ``url.<base>.insteadOf`` with a token, cookie file, proxy password, ``core.sshCommand`` /
    ``core.askPass``, and a ``config.worktree``."""
    outside.write_text("[http]\n\textraheader = AUTHORIZATION: bearer SECRET_INCLUDED\n")
    (repo / ".git" / "SECRET_STORE").write_text("https://me:SECRET_IN_STORE_FILE@example.com\n")
    (repo / ".git" / "inner.inc").write_text(
        '[http "https://example.com/"]\n\textraheader = X: SECRET_INNER\n'
    )
    with (repo / ".git" / "config").open("a") as config:
        config.write(_CREDENTIALS.format(outside=outside))
    git(repo, "config", "extensions.worktreeConfig", "true")
    git(repo, "config", "--worktree", "http.extraHeader", "AUTHORIZATION: bearer SECRET_WORKTREE")
