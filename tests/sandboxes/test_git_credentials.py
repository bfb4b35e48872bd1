"""The sandbox's ``.git`` holds no credential: every configuration file is rewritten on the host
from git's own parse, keeping what git needs (remotes by name, branches, ``core`` settings), and
the files it included stay behind. Real repositories, real sandboxes of each kind."""

from __future__ import annotations

from pathlib import Path

import pytest

from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.sandboxes.git_config import (
    holds_credential,
    read_config,
    sandbox_config,
    strip_credentials,
    write_config,
)
from clover_agent.sandboxes.workspace import copy_workspace, plan_workspace
from tests.git_repos import STORED_SECRETS, git, make_repo, store_credentials
from tests.sandbox_specs import sandbox_spec

from .conftest import tree_snapshot

SUBMODULE_SECRET = "SECRET_SUBMODULE"


def credentials_repo(tmp_path: Path) -> Path:
    """A repository with a submodule, every stored-credential shape in its configuration
    (:func:`store_credentials`) and one more in the submodule's."""
    lib = make_repo(tmp_path / "lib", {"lib.py": "LIB = 1\n"})
    repo = make_repo(tmp_path / "repo", {"app.py": "APP = 1\n"})
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "sub")
    git(repo, "commit", "-qm", "submodule")
    git(repo / "sub", "config", "http.extraheader", f"AUTHORIZATION: bearer {SUBMODULE_SECRET}")
    store_credentials(repo, tmp_path / "secret.inc")
    return repo


def assert_no_secret(text: str) -> None:
    found = [s for s in (*STORED_SECRETS, SUBMODULE_SECRET) if s in text]
    assert not found, f"secrets in the sandbox: {found}\n{text}"


@pytest.mark.parametrize("kind", ["local", pytest.param("docker", marks=pytest.mark.docker)])
async def test_the_sandbox_gets_no_stored_credential_and_git_still_works(kind: str, tmp_path: Path) -> None:
    repo = credentials_repo(tmp_path)
    before = tree_snapshot(repo)
    async with create_sandbox(kind, sandbox_spec(repo)) as sb:
        config = await sb.exec("cat /workspace/.git/config /workspace/.git/config.worktree")
        assert config.exit_code == 0
        assert_no_secret(config.output)
        listed = await sb.exec("git config --list --show-origin && git -C sub config --list --show-origin")
        assert (
            listed.exit_code == 0
            and "file:.git/config\tremote.origin.url=https://github.com/o/r.git" in listed.output
        )
        assert_no_secret(listed.output)
        # Nothing anywhere in the copied .git: the files an include or a store helper names stayed behind.
        anywhere = await sb.exec(
            "grep -r -a -l SECRET_ .git; test ! -e .git/inner.inc -a ! -e .git/SECRET_STORE"
        )
        assert anywhere.exit_code == 0 and anywhere.output == ""
        status = await sb.exec("git status --porcelain && git log --format=%s && git -C sub status --short")
        assert status.exit_code == 0 and status.output.splitlines() == ["submodule", "initial"]
        remotes = await sb.exec("git remote -v && git config branch.main.remote")
        assert "origin\thttps://github.com/o/r.git (push)" in remotes.output
        assert remotes.output.endswith("(push)\norigin\n")  # branch.main keeps its remote by name
    assert tree_snapshot(repo) == before  # the user's .git/config byte for byte, and everything else


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("http.extraheader", "AUTHORIZATION: basic c2VjcmV0"),
        ("HTTP.https://github.com/.ExtraHeader", "AUTHORIZATION: bearer x"),
        ("remote.origin.url", "https://x-access-token:ghp_x@github.com/o/r.git"),
        ("remote.origin.pushurl", "https://ghp_x@github.com/o/r.git"),
        ("submodule.lib.url", "ssh://user:pw@host/lib.git"),
        ("credential.helper", "!echo password=x"),
        ("credential.https://example.com.username", "me"),
        ("include.path", "/root/secret.inc"),
        ("includeIf.gitdir:/x/.path", "x.inc"),
        ("url.https://ghp_x@github.com/.insteadOf", "https://github.com/"),
        ("url.https://github.com/.pushInsteadOf", "https://ghp_x@github.com/"),
        ("http.cookieFile", "/tmp/cookies"),
        ("http.proxy", "http://user:pw@proxy:3128"),
        ("remote.origin.proxy", "user@proxy:3128"),
        ("core.sshCommand", "ssh -i key"),
        ("core.askPass", "/bin/askpass"),
        ("credential.helper", None),
    ],
)
def test_credential_shapes(key: str, value: str | None) -> None:
    assert holds_credential(key, value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("remote.origin.url", "https://github.com/o/r.git"),
        ("remote.origin.url", "ssh://git@github.com/o/r.git"),  # a login name, not a secret
        ("remote.origin.url", "git@github.com:o/r.git"),
        ("credential.helper", ""),  # turns the helpers off
        ("core.sshCommand", ""),
        ("url.git@github.com:.insteadOf", "https://github.com/"),
        ("http.proxy", "http://proxy:3128"),
        ("branch.main.merge", "refs/heads/main"),
    ],
)
def test_harmless_settings(key: str, value: str | None) -> None:
    assert not holds_credential(key, value)


def test_strip_credentials_keeps_the_rest_of_the_url() -> None:
    assert strip_credentials("https://x:tok@en@github.com/o/r.git") == "https://github.com/o/r.git"
    assert strip_credentials("https://TOKEN@github.com/o") == "https://github.com/o"
    assert strip_credentials("ssh://git@host/r.git") == "ssh://git@host/r.git"
    assert strip_credentials("ssh://git:pw@host/r.git") == "ssh://host/r.git"


def test_the_written_file_is_what_git_reads_back(tmp_path: Path) -> None:
    entries = [
        ("core.bare", "false"),
        ("core.bare", None),
        ('remote.we"ird\\ na.me\tx.url', "https://github.com/o/r.git"),
        ("branch.a b;#c.description", ' lead # ; and \\ back "q" tab\there \nnewline\b\r '),
        ("branch.a b;#c.description", ""),
    ]
    path = tmp_path / "config"
    path.write_bytes(write_config(entries))
    assert read_config(path) == entries


@pytest.mark.parametrize(
    ("rel", "worktree", "kept"),
    [
        (".git/modules/sub/config", "../../../sub", True),  # a submodule's: inside the copy
        (".git/modules/sub/config", "../../../../elsewhere", False),
        (".git/config", "/home/user/project", False),  # the user's own tree: never
    ],
)
def test_core_worktree_is_kept_only_inside_the_copy(
    tmp_path: Path, rel: str, worktree: str, kept: bool
) -> None:
    path = tmp_path / "config"
    git(tmp_path, "config", "--file", str(path), "core.worktree", worktree)
    rewritten = sandbox_config(path, rel)
    (tmp_path / "new").write_bytes(rewritten.text)
    assert read_config(tmp_path / "new") == ([("core.worktree", worktree)] if kept else [])


def test_a_nested_repository_and_a_symlinked_config_are_rewritten_too(tmp_path: Path) -> None:
    """A nested repository's own ``.git`` (copied whole) is rewritten like the top one; a
    ``.git/config`` that is a symlink to a file elsewhere goes in as a plain rewritten file."""
    repo = make_repo(tmp_path / "repo", {"app.py": "APP = 1\n"})
    nested = make_repo(repo / "vendor" / "nested", {"n.py": "N = 1\n"})
    git(nested, "config", "remote.origin.url", "https://ghp_NESTED@github.com/o/n.git")
    elsewhere = tmp_path / "elsewhere.config"
    (repo / ".git" / "config").rename(elsewhere)
    with elsewhere.open("a") as config:
        config.write(
            '[http]\n\textraheader = X: SECRET_LINKED\n[remote "origin"]\n\turl = https://github.com/o/r\n'
        )
    (repo / ".git" / "config").symlink_to(elsewhere)
    copy = tmp_path / "copy"
    copy.mkdir()
    copy_workspace(plan_workspace(repo), copy)
    assert not (copy / ".git" / "config").is_symlink()
    assert read_config(copy / ".git" / "config")[-1] == ("remote.origin.url", "https://github.com/o/r")
    assert read_config(copy / "vendor" / "nested" / ".git" / "config")[-1] == (
        "remote.origin.url",
        "https://github.com/o/n.git",
    )
    text = b"".join(p.read_bytes() for p in copy.rglob("config"))
    assert b"SECRET_LINKED" not in text and b"ghp_NESTED" not in text
    assert git(copy, "status", "--porcelain") == "?? vendor/\n"
