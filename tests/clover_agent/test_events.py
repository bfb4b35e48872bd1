"""The event bus: sync subscribers inline, async ones in order on their own worker; JSON round trip."""

from __future__ import annotations

import asyncio
import json

import pytest

from clover_agent.agent.trajectory import TrajectoryError, read_events
from clover_agent.events import (
    EVENT_TYPES,
    Done,
    EventBus,
    MessageAdded,
    ModelDelta,
    ToolCallFinished,
    event_from_dict,
)


async def test_sync_and_async_subscribers_see_every_event_in_order() -> None:
    bus = EventBus()
    seen_sync: list[str] = []
    seen_async: list[str] = []

    async def slow(event) -> None:
        await asyncio.sleep(0.01 if len(seen_async) % 2 == 0 else 0)
        seen_async.append(event.text)

    bus.subscribe(lambda e: seen_sync.append(e.text))
    bus.subscribe(slow)
    for i in range(5):
        bus.emit(ModelDelta(step=1, kind="text", text=str(i)))
    assert seen_sync == ["0", "1", "2", "3", "4"]  # inline, before emit returns
    await bus.drain()
    assert seen_async == ["0", "1", "2", "3", "4"]
    await bus.close()


async def test_unsubscribe_and_async_errors_surface_on_drain() -> None:
    bus = EventBus()
    seen: list[object] = []
    unsubscribe = bus.subscribe(seen.append)

    async def broken(event) -> None:
        raise RuntimeError("subscriber bug")

    bus.subscribe(broken)
    bus.emit(MessageAdded(message={"role": "user", "content": "hi"}))
    unsubscribe()
    bus.emit(MessageAdded(message={"role": "user", "content": "again"}))
    assert len(seen) == 1
    with pytest.raises(RuntimeError, match="subscriber bug"):
        await bus.drain()
    await bus.close()


def test_events_round_trip_through_dicts() -> None:
    events = [
        ToolCallFinished(
            step=2, call_id="c1", name="shell", output="ok", is_error=False, data={"exit_code": 0}
        ),
        Done(outcome="submitted", exit_code=0, message="m", stats={"steps": 3}, patch="diff"),
    ]
    for event in events:
        data = event.to_dict()
        assert data["type"] == event.type
        assert event_from_dict(data) == event
    assert {"model_delta", "provisional_block", "approval_requested", "checkpoint_taken", "done"} <= set(
        EVENT_TYPES
    )


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('"just a string"', "not a trajectory event (a JSON str)"),
        ("[1, 2]", "not a trajectory event (a JSON list)"),
        ('{"type": "no_such_event"}', "not a trajectory event (KeyError"),
        ('{"type": "done"}', "not a trajectory event (TypeError"),
    ],
)
def test_a_trajectory_line_that_is_no_event_is_named(tmp_path, line: str, expected: str) -> None:
    good = json.dumps(MessageAdded(message={"role": "user", "content": "hi"}).to_dict())
    path = tmp_path / "trajectory.jsonl"
    path.write_text(f"{good}\n{line}\n{good}\n")
    with pytest.raises(TrajectoryError) as caught:
        read_events(path)
    assert f"{path}:2: {expected}" in str(caught.value)
