"""The live block-diffusion view with the real engine on a tiny checkpoint the test writes: the
blocks being denoised appear (undecided slots shaded, each pass's new slots highlighted) and are
committed into the transcript's text."""

from __future__ import annotations

from pathlib import Path

import pytest

from clover_agent.backends.engine import EngineBackend
from clover_agent.engine.decoding.sampling import SamplingParams
from clover_agent.engine.loading.tiny import write_tiny_checkpoint
from clover_agent.events import Done, ModelCallStarted, ModelDelta, ProvisionalBlock
from clover_agent.session.assembly import SessionConfig
from clover_agent.tui.app import CloverApp
from clover_agent.tui.widgets.activity import ActivityLine
from clover_agent.tui.widgets.diffusion_view import UNDECIDED
from clover_agent.tui.widgets.status_bar import StatusBar
from tests.sandbox_specs import sandbox_spec
from tests.tui.helpers import calculator_repo, send, wait_for


@pytest.mark.slow
async def test_provisional_blocks_appear_and_commit(tmp_path: Path) -> None:
    repo = calculator_repo(tmp_path)
    # a window that holds the TUI's system prompt and tool specs (the tiny default is 4096)
    model = write_tiny_checkpoint(
        tmp_path / "ckpt", peaked=True, seed=5, overrides={"max_position_embeddings": 16384}
    )

    def backend() -> EngineBackend:
        return EngineBackend(
            model, device="cpu", sampling=SamplingParams.greedy(), max_new_tokens=40, progress=None
        )

    options = SessionConfig(
        repo=repo, make_backend=backend, spec=sandbox_spec(repo), sandbox_kind="local", max_steps=1
    )
    app = CloverApp(options)
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, "change A")
        await wait_for(
            pilot, lambda: any(isinstance(e, Done) for e in app.events), "the model call", deadline_s=600
        )

        blocks = [e for e in app.events if isinstance(e, ProvisionalBlock)]
        assert blocks, "the engine streamed no provisional block"
        view = app.transcript.diffusion
        assert view is not None and view.passes_shown == len(blocks)
        assert view.committed >= 1 and view.has_class("-idle")  # committed, then waiting

        partial = next(b for b in blocks if not all(b.filled))
        drawn = view.render_block(partial)
        assert drawn.plain.count(UNDECIDED) == partial.filled.count(False)
        highlighted = [s for s in drawn.spans if "reverse" in str(s.style)]
        assert len(highlighted) == len(partial.newly_filled)  # this pass's slots stand out

        # the committed text reached the transcript (as thinking or reply)
        committed = "".join(e.text for e in app.events if isinstance(e, ModelDelta))
        assert committed.strip()
        shown = " ".join(getattr(w, "text", "") or getattr(w, "shown", "") for w in app.transcript.children)
        assert committed.strip()[:10] in shown.replace("\n", " ") or committed.strip()[:10] in shown
        assert "/fwd" in app.query_one(StatusBar).line().plain  # tokens per forward is known

        # the activity line said what the engine was doing: the prompt's prefill, then each block
        (call,) = [e for e in app.events if isinstance(e, ModelCallStarted)]
        history = app.query_one(ActivityLine).history
        waiting = f"waiting for the first token (a prompt of {call.prompt_tokens} tokens)"
        denoising = [h for h in history if h.startswith("denoising block ")]
        assert call.prompt_tokens > 0 and waiting in history and denoising, history
        assert history.index(waiting) < history.index(denoising[0])
        first = blocks[0]
        assert denoising[0] == f"denoising block {first.block} (pass {first.denoise_step})"
        await pilot.press("ctrl+q")
