"""How many requests a server decodes together: the card's memory plan on a GPU (here planned for
cards of given sizes, on the CPU), none on the CPU; and the context it was planned for is the
longest conversation the server takes."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from clover_agent.backends.base import BackendUnavailable
from clover_agent.engine.loading.readiness import GiB
from clover_agent.engine.memory_plan import checkpoint_plan
from clover_agent.serve.server import serving_in_thread
from clover_agent.serve.sizing import CPU_MAX_RUNNING, concurrency
from tests.serve.servers import served_model


def test_on_the_cpu_nothing_is_planned(real_vocab_checkpoint: Path) -> None:
    running, lines = concurrency(
        real_vocab_checkpoint, card_bytes=None, max_running=None, context_tokens=4096
    )
    assert running == CPU_MAX_RUNNING and "none on the CPU" in lines[0]
    assert concurrency(real_vocab_checkpoint, card_bytes=None, max_running=3, context_tokens=4096)[0] == 3


def test_on_a_card_the_plan_chooses_the_requests(real_vocab_checkpoint: Path) -> None:
    running, lines = concurrency(
        real_vocab_checkpoint, card_bytes=8 * GiB, max_running=None, context_tokens=4096
    )
    plan = checkpoint_plan(real_vocab_checkpoint, card_bytes=8 * GiB, context_tokens=4096)
    assert running == plan.max_running >= 1 and lines == plan.lines()
    # asked for fewer: that many, planned as such
    assert concurrency(real_vocab_checkpoint, card_bytes=8 * GiB, max_running=2, context_tokens=4096)[0] == 2


def test_a_card_too_small_is_refused_with_what_would_fit(real_vocab_checkpoint: Path) -> None:
    with pytest.raises(BackendUnavailable) as refused:
        concurrency(real_vocab_checkpoint, card_bytes=64 << 20, max_running=None, context_tokens=4096)
    assert "does not fit this card" in str(refused.value)


@pytest.mark.slow
def test_a_prompt_past_the_planned_context_is_refused(real_vocab_checkpoint: Path) -> None:
    served = served_model(real_vocab_checkpoint, context_tokens=256)
    assert served.context_window == 256 < served.backend.context_window
    with serving_in_thread(served) as base_url:
        client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError) as error:
            client.chat.completions.create(
                model="clover", messages=[{"role": "user", "content": "word " * 300}]
            )
        assert (
            error.value.code == "context_length_exceeded" and "context window is 256" in error.value.message
        )
        short = client.chat.completions.create(
            model="clover", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert short.usage is not None and short.usage.completion_tokens <= 4
