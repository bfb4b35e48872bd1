"""``clover_agent.engine`` exports its public classes lazily: importing it (or ``clover_agent``)
does not import torch until ``Engine`` is asked for."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def run_python(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_importing_the_packages_does_not_import_torch() -> None:
    out = run_python(
        """
        import sys
        import clover_agent
        import clover_agent.engine as engine
        assert "torch" not in sys.modules, "import clover_agent.engine imported torch"
        from clover_agent.engine import GenerationResult, SamplingParams
        assert "torch" not in sys.modules, "SamplingParams imported torch"
        assert SamplingParams().block_size == 32 and GenerationResult([], "stop", 0).forwards == 0
        assert {"Engine", "SamplingParams", "GenerationResult"} <= set(dir(engine))
        print("torch-free")
        """
    )
    assert out == "torch-free"


def test_engine_is_loaded_on_first_access() -> None:
    out = run_python(
        """
        import sys
        from clover_agent.engine import Engine
        from clover_agent.engine.engine import Engine as Defined
        assert Engine is Defined and "torch" in sys.modules
        print(Engine.__name__)
        """
    )
    assert out == "Engine"


def test_an_unknown_name_is_an_attribute_error() -> None:
    import clover_agent.engine as engine

    with pytest.raises(AttributeError, match="has no attribute 'Engin'"):
        engine.Engin  # noqa: B018
