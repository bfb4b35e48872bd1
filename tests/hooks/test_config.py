"""Where hooks come from: the user's settings always, a repository's file only once trusted; and
how a call's arguments are shown to a hook and read back from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from clover_agent.errors import UsageError
from clover_agent.hooks.tool_input import aliases, from_hook, hook_view
from clover_agent.launch import hooks_of
from clover_agent.settings import Settings, repo_settings, trusted_only_values

HOOK = '[[hooks.PreToolUse]]\nmatcher = "Bash"\ncommand = "deny.sh"\n'


def test_the_users_settings_hold_hooks_in_either_form(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        HOOK + '\n[[hooks.Stop]]\nhooks = [{ type = "command", command = "notify.sh", timeout = 5 }]\n'
    )
    settings = Settings.load({"CLOVER_CONFIG": str(config), "HOME": str(tmp_path)})
    found = hooks_of(settings, tmp_path, repo_settings(tmp_path))
    assert [(h.event, h.command, h.matcher, h.timeout_s, h.origin) for h in found] == [
        ("PreToolUse", "deny.sh", "Bash", 60.0, "settings"),
        ("Stop", "notify.sh", None, 5.0, "settings"),
    ]


def test_a_bad_hook_table_names_the_file(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[[hooks.PreToolUse]]\ncommand = "x"\nwhere = "moon"\n')
    settings = Settings.load({"CLOVER_CONFIG": str(config), "HOME": str(tmp_path)})
    with pytest.raises(UsageError, match=f"{config}.*where must be"):
        hooks_of(settings, tmp_path, repo_settings(tmp_path))
    config.write_text("hooks = 3\n")
    with pytest.raises(UsageError, match="hooks must hold"):
        Settings.load({"CLOVER_CONFIG": str(config), "HOME": str(tmp_path)})


def test_a_repositorys_hooks_apply_only_once_trusted(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / ".clover").mkdir(parents=True)
    (repo / ".clover" / "config.toml").write_text(HOOK)
    settings = Settings.load({"CLOVER_CONFIG": str(tmp_path / "none.toml"), "HOME": str(tmp_path)})
    untrusted = repo_settings(repo)
    assert untrusted.hooks == {} and "hooks" in untrusted.ignored
    assert hooks_of(settings, repo, untrusted) == ()
    trusted = hooks_of(settings, repo, repo_settings(repo, trusted=True))
    assert [(h.command, h.origin) for h in trusted] == [("deny.sh", "repository")]
    assert "hooks.PreToolUse" in trusted_only_values(repo)


def test_tool_input_carries_claude_codes_names_and_reads_them_back(tmp_path: Path) -> None:
    args = {"command": "str_replace", "path": "/workspace/a/b.py", "old_str": "x", "new_str": "y"}
    view = hook_view("editor", args, "/home/me/repo")
    assert view["file_path"] == "/home/me/repo/a/b.py" and view["old_string"] == "x"
    assert aliases("editor", args) == ("editor", "Edit")
    assert aliases("shell", {"command": "ls"}) == ("shell", "Bash")
    # a whole tool_input echoed back with one change: the change wins, the path is ours again
    back = from_hook("editor", args, {**view, "new_string": "z"}, ("/home/me/repo",))
    assert back == {**args, "new_str": "z"}
    # a path out of the repository (or climbing out of it) is passed as given, for the policy to judge
    assert (
        from_hook("editor", args, {"file_path": "/etc/passwd"}, ("/home/me/repo",))["path"] == "/etc/passwd"
    )
    climbing = from_hook("editor", args, {"file_path": "/home/me/repo/../x"}, ("/home/me/repo",))
    assert climbing["path"] == "/home/me/repo/../x"
    # a workspace path that leads out gets no file_path at all
    assert "file_path" not in hook_view("editor", {"command": "view", "path": "/etc/passwd"}, "/home/me/repo")
