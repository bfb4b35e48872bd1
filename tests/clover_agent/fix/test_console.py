"""The console renderer: model text streams, tool-call markup never shows, results are trimmed."""

from __future__ import annotations

import io

from clover_agent.events import Done, ModelDelta, ModelResponded, ToolCallFinished, ToolCallStarted
from clover_agent.fix.console import ConsoleRenderer

CALL = "<tool_call>\n<function=shell>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>"


def responded(content: str = "") -> ModelResponded:
    return ModelResponded(
        step=1, raw="", content=content, reasoning=None, tool_calls=[], format_error=None,
        prompt_tokens=1, completion_tokens=1, finish_reason="stop",
    )  # fmt: skip


def test_streamed_text_stops_at_the_tool_call_even_when_the_tag_is_split() -> None:
    out = io.StringIO()
    render = ConsoleRenderer(out)
    text = "Listing the files.\n\n" + CALL
    for i in range(0, len(text), 3):  # deltas that cut "<tool_call>" in pieces
        render(ModelDelta(step=1, kind="text", text=text[i : i + 3]))
    render(ModelDelta(step=1, kind="reasoning", text="hidden thoughts"))
    render(responded())
    render(ToolCallStarted(step=1, call_id="c", name="shell", arguments={"command": "ls"}))
    render(
        ToolCallFinished(
            step=1, call_id="c", name="shell", output="\n".join(f"f{i}" for i in range(30)), is_error=False
        )
    )
    render(Done(outcome="submitted", exit_code=0, message="m", summary="all done"))
    shown = out.getvalue()
    assert shown.startswith("Listing the files.\n→ shell command=ls\n")
    assert "<tool" not in shown and "hidden thoughts" not in shown
    assert "  ✓ f0\n" in shown and "f7" in shown and "f8\n" not in shown and "… 22 more lines" in shown
    assert shown.endswith("done (submitted): all done\n")


def test_unstreamed_content_is_printed_once_and_reasoning_on_request() -> None:
    out = io.StringIO()
    render = ConsoleRenderer(out, show_reasoning=True)
    render(ModelDelta(step=1, kind="reasoning", text="thinking"))
    render(responded("visible"))
    render(responded("second turn"))
    render(ModelDelta(step=3, kind="reasoning", text="more thoughts"))
    render(ModelDelta(step=3, kind="text", text="Answer."))
    render(responded("Answer."))
    assert out.getvalue() == "thinking\nvisible\nsecond turn\nmore thoughts\nAnswer.\n"
