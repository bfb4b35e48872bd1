"""Policy rules and presets: deny wins, ask needs a person; the tools say what a call is."""

from __future__ import annotations

from typing import Any

import pytest

from clover_agent.agent.policy import PRESETS, CallView, Decision, Policy, Rule, preset
from clover_agent.errors import ExitCode, UsageError
from clover_agent.tools.registry import default_tools

TOOLS = {tool.name: tool for tool in default_tools()}


def view(name: str, arguments: dict[str, Any]) -> CallView:
    return CallView.of(TOOLS[name], arguments)


def decision(policy: Policy, name: str, arguments: dict[str, Any]) -> Decision:
    return policy.check(view(name, arguments)).decision


def test_deny_wins_over_allow_and_ask() -> None:
    policy = Policy(
        "p",
        (
            Rule(Decision.ALLOW, tool="editor"),
            Rule(Decision.ASK, tool="editor:str_replace"),
            Rule(Decision.DENY, tool="editor", path="/workspace/secrets/*"),
        ),
        default=Decision.DENY,
    )
    assert decision(policy, "editor", {"command": "view", "path": "/workspace/a.py"}) is Decision.ALLOW
    assert decision(policy, "editor", {"command": "str_replace", "path": "/workspace/a.py"}) is Decision.ASK
    verdict = policy.check(view("editor", {"command": "view", "path": "/workspace/secrets/key.pem"}))
    assert verdict.decision is Decision.DENY
    assert "secrets" in verdict.reason
    assert decision(policy, "shell", {"command": "ls"}) is Decision.DENY  # default


def test_paths_are_normalised_before_matching() -> None:
    workspace = preset("workspace")
    assert decision(workspace, "editor", {"command": "view", "path": "/workspace"}) is Decision.ALLOW
    assert decision(workspace, "editor", {"command": "view", "path": "/workspace/src/a.py"}) is Decision.ALLOW
    for outside in ("/etc/passwd", "/workspace/../etc/passwd", "/workspacex/a", "/tmp/x"):
        assert decision(workspace, "editor", {"command": "view", "path": outside}) is Decision.DENY, outside
    # Relative paths are the tool's to refuse (with a hint); for the policy they are inside.
    assert decision(workspace, "editor", {"command": "view", "path": "src/a.py"}) is Decision.ALLOW


def test_read_only_preset() -> None:
    ro = preset("read-only")
    allowed = [
        ("editor", {"command": "view", "path": "/workspace/a.py"}),
        ("search", {"pattern": "def "}),
        ("run_tests", {}),
        ("finish", {"summary": "done"}),
    ]
    denied = [
        ("editor", {"command": c, "path": "/workspace/a.py"})
        for c in ("create", "str_replace", "insert", "undo_edit")
    ] + [("shell", {"command": "ls"})]
    for name, args in allowed:
        assert decision(ro, name, args) is Decision.ALLOW, (name, args)
    for name, args in denied:
        assert decision(ro, name, args) is Decision.DENY, (name, args)


def test_workspace_asks_and_ci_denies_reaching_out() -> None:
    call = ("shell", {"command": "pip install requests"})
    assert decision(preset("workspace"), *call) is Decision.ASK
    assert decision(preset("ci"), *call) is Decision.DENY
    for name in PRESETS:
        if name != "read-only":
            assert decision(preset(name), "shell", {"command": "python -m pytest -q"}) is Decision.ALLOW
    assert all(rule.decision is not Decision.ASK for rule in preset("ci").rules)
    # A command pattern matches what the tool runs: the editor's `command` is no command line.
    asks_everything = Policy("p", (Rule(Decision.ASK, tool="*", command="*"),))
    assert decision(asks_everything, "shell", {"command": "ls"}) is Decision.ASK
    assert decision(asks_everything, "editor", {"command": "view", "path": "/workspace"}) is Decision.ALLOW


def test_always_is_remembered_per_rule_action_and_command() -> None:
    workspace = preset("workspace")
    one = workspace.check(view("shell", {"command": "pip install requests"}))
    again = workspace.check(view("shell", {"command": "pip install requests"}))
    other = workspace.check(view("shell", {"command": "pip install rich"}))
    assert one.key == again.key != other.key


def test_unknown_preset_is_a_usage_error() -> None:
    with pytest.raises(UsageError) as info:
        preset("yolo")
    assert info.value.exit_code == ExitCode.USAGE
    assert "read-only" in info.value.message
