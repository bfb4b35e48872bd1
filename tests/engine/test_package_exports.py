"""Importing ``clover_agent`` or its engine package does not import torch: only the modules that
compute do (``clover_agent.engine.engine``), and the sampling parameters stay torch-free."""

from __future__ import annotations

import subprocess
import sys
import textwrap


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
        import clover_agent.engine, clover_agent.kernels, clover_agent.tools, clover_agent.sandboxes
        assert "torch" not in sys.modules, "importing the packages imported torch"
        from clover_agent.engine.decoding.sampling import GenerationResult, SamplingParams
        assert "torch" not in sys.modules, "SamplingParams imported torch"
        assert SamplingParams().block_size == 32 and GenerationResult([], "stop", 0).forwards == 0
        print("torch-free")
        """
    )
    assert out == "torch-free"


def test_the_engine_module_loads_torch() -> None:
    out = run_python(
        """
        import sys
        from clover_agent.engine.engine import Engine
        assert "torch" in sys.modules
        print(Engine.__name__)
        """
    )
    assert out == "Engine"
