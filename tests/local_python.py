"""The Python that local-sandbox runs find first on PATH during the tests: a virtual environment
with only pytest (this session's version), made once next to the test venv.

The local sandbox runs a project's tests with whatever ``python3`` this machine has. A developer's
or a CI machine's Python can carry any plugins (hypothesis, pytest-benchmark, ...): they change
what a run loads and make each run seconds slower. The tests pin that Python down instead.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

#: Where it is made: beside the running venv, so each checkout's venv has its own.
HOME = Path(sys.prefix) / "local-sandbox-python"
READY = HOME / "ready"  # written last: a folder without it is unfinished


def ensure() -> Path | None:
    """The environment's bin folder, made now if it is missing (one session at a time makes it);
    None, with the reason printed, when it cannot be made: the local sandbox then uses this
    machine's ``python3`` as it is."""
    with open(HOME.parent / "local-sandbox-python.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if READY.is_file() and READY.read_text() == pytest.__version__:
            return HOME / "bin"
        shutil.rmtree(HOME, ignore_errors=True)
        try:
            subprocess.run(
                [sys.executable, "-m", "venv", str(HOME)], check=True, capture_output=True, text=True
            )
            subprocess.run(
                [str(HOME / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                 f"pytest=={pytest.__version__}"],
                check=True, capture_output=True, text=True, timeout=600,
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError) as exc:
            said = getattr(exc, "stderr", "") or ""
            print(f"tests: no clean Python for the local sandbox ({exc}) {said[-500:]}", file=sys.stderr)
            shutil.rmtree(HOME, ignore_errors=True)
            return None
        READY.write_text(pytest.__version__)
        return HOME / "bin"


def put_first_on_path() -> None:
    """Put the environment first on this process's PATH (pytest-xdist's workers inherit it)."""
    bin_dir = ensure()
    if bin_dir is not None:
        os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
