"""Budgets (checked before each model call) and stuck detection (one nudge, then stop)."""

from __future__ import annotations

import time

import pytest

from clover_agent.agent.budget import Budget, LimitsExceeded
from clover_agent.agent.stuck import AgentStuck, StuckDetector
from clover_agent.errors import ExitCode


def test_step_budget_stops_before_the_call_past_the_limit() -> None:
    budget = Budget(max_steps=3, max_time_s=None)
    warned = []
    for _ in range(3):
        warned += budget.check()
        budget.record_call(10, 5)
    with pytest.raises(LimitsExceeded) as info:
        budget.check()
    assert info.value.exit_code == ExitCode.BUDGET_EXHAUSTED
    assert "3 of 3" in info.value.message and "--max-steps" in info.value.message
    assert [w[0] for w in warned] == ["steps"]  # warned once, at 80 %


def test_token_budget_counts_the_prompt_about_to_be_sent() -> None:
    budget = Budget(max_steps=None, max_time_s=None, max_tokens=1000)
    budget.check(next_prompt_tokens=600)
    budget.record_call(600, 100)
    with pytest.raises(LimitsExceeded) as info:
        budget.check(next_prompt_tokens=400)  # 700 used + 400 > 1000
    assert "700 tokens used" in info.value.message and "--max-tokens" in info.value.message


def test_token_and_time_warnings_come_once_at_the_warning_fraction() -> None:
    budget = Budget(max_steps=None, max_time_s=100, max_tokens=1000, elapsed_before_s=10)
    assert budget.check(next_prompt_tokens=700) == []  # 70 % of the tokens, 10 % of the time
    budget.record_call(700, 50)
    ((resource, used, limit),) = budget.check(next_prompt_tokens=60)  # 810 of 1000
    assert (resource, used, limit) == ("tokens", 810.0, 1000.0)
    assert budget.check(next_prompt_tokens=100) == []  # warned once
    budget.elapsed_before_s = 85
    assert [w[0] for w in budget.check()] == ["time_s"]


def test_time_budget_includes_resumed_time() -> None:
    budget = Budget(max_steps=None, max_time_s=10, elapsed_before_s=9.99)
    time.sleep(0.02)
    with pytest.raises(LimitsExceeded) as info:
        budget.check()
    assert "time budget" in info.value.message
    assert budget.remaining_time_s() == 0.0


def test_same_call_gets_one_nudge_then_stops() -> None:
    detector = StuckDetector(repeats=3)
    call = ("editor", {"command": "view", "path": "/workspace/a.py"})
    assert detector.observe(call) is None
    assert detector.observe(call) is None
    nudge = detector.observe(call)
    assert nudge and "3 times" in nudge and "tool call" in nudge
    with pytest.raises(AgentStuck) as info:
        detector.observe(call)
    assert info.value.exit_code == ExitCode.AGENT_ERROR
    assert "view" in info.value.message


def test_varied_calls_and_errors_do_not_count() -> None:
    detector = StuckDetector(repeats=2)
    for i in range(10):
        assert detector.observe(("editor", {"command": "view", "path": f"/workspace/{i}.py"})) is None
        assert detector.observe(error=f"error {i}") is None


def test_same_error_from_different_calls_is_stuck_too() -> None:
    detector = StuckDetector(repeats=2)
    assert detector.observe(error="Your tool call could not be parsed") is None
    assert "error" in (detector.observe(error="Your tool call could not be parsed") or "")
    assert detector.observe(("search", {"pattern": "x"})) is None  # progress ends the streak
    assert detector.observe(error="another problem") is None
    with pytest.raises(AgentStuck):
        detector.observe(error="another problem")  # a second stuck episode: no second nudge
