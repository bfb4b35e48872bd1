"""Policy rules and presets: deny wins, ask needs a person, no terminal means deny."""

from __future__ import annotations

import pytest

from clover_agent.agent.policy import PRESETS, Decision, Policy, Rule, decide, is_mutating, preset
from clover_agent.errors import ExitCode, UsageError


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
    assert policy.check("editor", {"command": "view", "path": "/workspace/a.py"}).decision is Decision.ALLOW
    assert (
        policy.check("editor", {"command": "str_replace", "path": "/workspace/a.py"}).decision is Decision.ASK
    )
    verdict = policy.check("editor", {"command": "view", "path": "/workspace/secrets/key.pem"})
    assert verdict.decision is Decision.DENY
    assert "secrets" in verdict.reason
    assert policy.check("shell", {"command": "ls"}).decision is Decision.DENY  # default


def test_paths_are_normalised_before_matching() -> None:
    workspace = preset("workspace")
    assert workspace.check("editor", {"command": "view", "path": "/workspace"}).decision is Decision.ALLOW
    assert (
        workspace.check("editor", {"command": "view", "path": "/workspace/src/a.py"}).decision
        is Decision.ALLOW
    )
    for outside in ("/etc/passwd", "/workspace/../etc/passwd", "/workspacex/a", "/tmp/x"):
        assert workspace.check("editor", {"command": "view", "path": outside}).decision is Decision.DENY, (
            outside
        )
    # Relative paths are the tool's to refuse (with a hint); for the policy they are inside.
    assert workspace.check("editor", {"command": "view", "path": "src/a.py"}).decision is Decision.ALLOW


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
        assert ro.check(name, args).decision is Decision.ALLOW, (name, args)
    for name, args in denied:
        assert ro.check(name, args).decision is Decision.DENY, (name, args)


def test_workspace_asks_and_ci_denies_reaching_out() -> None:
    call = ("shell", {"command": "pip install requests"})
    assert preset("workspace").check(*call).decision is Decision.ASK
    assert preset("ci").check(*call).decision is Decision.DENY
    for name in PRESETS:
        if name != "read-only":
            assert preset(name).check("shell", {"command": "python -m pytest -q"}).decision is Decision.ALLOW
    assert all(rule.decision is not Decision.ASK for rule in preset("ci").rules)


def test_unknown_preset_is_a_usage_error() -> None:
    with pytest.raises(UsageError) as info:
        preset("yolo")
    assert info.value.exit_code == ExitCode.USAGE
    assert "read-only" in info.value.message


async def test_ask_goes_to_the_approver_or_is_denied_without_terminal() -> None:
    policy = preset("workspace")
    args = {"command": "git push origin main"}
    seen = []

    async def approve(name: str, arguments: dict, reason: str) -> bool:
        seen.append((name, arguments["command"], reason))
        return True

    outcome = await decide(policy, "shell", args, approve)
    assert outcome.approved and outcome.asked and outcome.decided_by == "user"
    assert seen and seen[0][:2] == ("shell", "git push origin main")
    outcome = await decide(policy, "shell", args, None)
    assert not outcome.approved and outcome.asked and outcome.decided_by == "no-terminal"


def test_mutating_calls() -> None:
    assert is_mutating("shell", {"command": "ls"})
    assert is_mutating("editor", {"command": "insert"})
    assert not is_mutating("editor", {"command": "view"})
    assert not is_mutating("run_tests", {})
