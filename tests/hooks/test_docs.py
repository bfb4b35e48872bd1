"""docs/hooks.md's examples are what the code reads: every TOML block in it is a valid set of hooks."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from clover_agent.hooks import parse_hooks

DOC = Path(__file__).resolve().parents[2] / "docs" / "hooks.md"


def test_every_toml_example_in_the_hooks_doc_parses() -> None:
    blocks = re.findall(r"```toml\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert len(blocks) >= 5
    events = set()
    for block in blocks:
        hooks = parse_hooks(tomllib.loads(block)["hooks"], origin="settings")
        assert hooks
        events |= {hook.event for hook in hooks}
    assert {"PreToolUse", "PostToolUse", "Stop", "PreHandBack"} <= events
