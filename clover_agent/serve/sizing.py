"""How many requests a server decodes together: on a GPU, the memory plan of the card
(``clover_agent.engine.memory_plan``, docs/serving.md) for the checkpoint at the context each
request may reach, refused with what would fit when nothing does; on the CPU, no plan (the
request count is the ``--max-running`` given, else :data:`CPU_MAX_RUNNING`)."""

from __future__ import annotations

from pathlib import Path

from clover_agent.backends.base import BackendUnavailable
from clover_agent.engine.memory_plan import checkpoint_plan

#: Requests decoded together on the CPU when none is asked for.
CPU_MAX_RUNNING = 8


def concurrency(
    model_dir: Path,
    *,
    card_bytes: int | None,
    max_running: int | None,
    context_tokens: int,
    experts: str = "auto",
    experts_on: str = "device",
) -> tuple[int, list[str]]:
    """(requests decoded together, the lines that say why). ``card_bytes``: the GPU's memory, None
    on the CPU. A plan that does not fit raises :class:`BackendUnavailable` with the plan and what
    would fit (fewer requests, a smaller expert format, a shorter context). ``experts``: the routed
    experts' format as loaded and ``experts_on`` where they are (``EngineBackend``'s choices)."""
    if card_bytes is None:
        running = max_running or CPU_MAX_RUNNING
        return running, [
            f"memory plan: none on the CPU; {running} request(s) decoded together (--max-running)"
        ]
    plan = checkpoint_plan(
        model_dir,
        card_bytes=card_bytes,
        experts=experts,
        context_tokens=context_tokens,
        max_running=max_running,
        experts_on=experts_on,
    )
    if not plan.fits:
        raise BackendUnavailable(
            "The checkpoint does not fit this card as asked:\n" + "\n".join(plan.lines())
        )
    return plan.max_running, plan.lines()
