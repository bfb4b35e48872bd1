"""What the task's container gets: clover-agent's package and the few libraries that ``clover-agent
run`` imports with the ``openai`` and ``replay`` backends, in one folder the container's own Python
(>= 3.11) imports, made on Harbor's side so the container needs no package index.

The libraries come from the package index through Harbor's ``pip`` (``pip install --target`` for the
container's Python version and machine, binary wheels only) and are cached per version, machine and
list; clover-agent's package is copied fresh from the one Harbor imported, so the container always
runs the same code as the agent class. No torch: the engine backend is never used in a container.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import clover_agent

#: What ``clover-agent run --sandbox none`` imports besides the standard library with the ``openai``
#: and ``replay`` backends: among clover-agent's own dependencies (tests/harbor/test_install.py
#: checks), without torch, the engine's and the interactive front ends' libraries.
RUN_REQUIREMENTS = (
    "jsonschema>=4.20",
    "markdown-it-py>=3.0",
    "mdit-py-plugins>=0.4",
    "linkify-it-py>=2.0",
    "rich>=13.0",
)
#: Where the folder goes in the container: ``lib/`` (imported) and ``bin/clover-agent`` (a launcher).
CONTAINER_HOME = "/opt/clover-agent"
PIP_TIMEOUT_S = 900
_MAKING = threading.Lock()  # one folder made at a time in this process


class InstallError(RuntimeError):
    """The folder for the container could not be made (pip failed, or the package is not whole)."""


def default_cache() -> Path:
    """``$CLOVER_HARBOR_CACHE``, else ``$XDG_CACHE_HOME/clover-agent/harbor`` (``~/.cache/...``)."""
    if os.environ.get("CLOVER_HARBOR_CACHE"):
        return Path(os.environ["CLOVER_HARBOR_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "clover-agent" / "harbor"


def libraries(python: str, machine: str, cache: Path) -> Path:
    """The folder of :data:`RUN_REQUIREMENTS` for CPython ``python`` ("3.11") on ``machine``
    ("x86_64"), made once and reused: into a temporary folder, renamed when whole (Harbor sets up
    several trials at once, in threads of one process and in other processes)."""
    key = hashlib.sha256(repr((python, machine, RUN_REQUIREMENTS)).encode()).hexdigest()[:16]
    folder = cache / f"libs-py{python}-{machine}-{key}"
    with _MAKING:
        if folder.is_dir():
            return folder
        cache.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=cache))
        try:
            _pip_target(partial, python, machine)
            os.replace(partial, folder)
        except OSError:
            if not folder.is_dir():  # not another process's folder made meanwhile: a real failure
                raise
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return folder


def _pip_target(target: Path, python: str, machine: str) -> None:
    platforms = [f"--platform={tag}_{machine}" for tag in ("manylinux_2_17", "manylinux2014", "linux")]
    command = [
        sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
        "--target", str(target), "--only-binary=:all:", "--implementation=cp",
        f"--python-version={python}", *platforms, *RUN_REQUIREMENTS,
    ]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InstallError(f"pip could not run for the container's libraries: {exc}") from exc
    if done.returncode != 0:
        raise InstallError(
            f"pip could not fetch clover-agent's libraries for Python {python} on {machine} "
            f"(Harbor's environment needs pip and the package index):\n{(done.stderr or done.stdout)[-2000:]}"
        )


def stage(python: str, python_path: str, machine: str, cache: Path, into: Path) -> Path:
    """``into/lib`` (the libraries and clover-agent's package, links followed) and
    ``into/bin/clover-agent``, which runs the package with ``python_path -I``: isolated, so the
    task's folder, ``PYTHONPATH`` and user site cannot shadow it, and nothing of it reaches the
    task's own processes."""
    lib = into / "lib"
    shutil.copytree(libraries(python, machine, cache), lib)
    package = Path(clover_agent.__file__).resolve().parent
    shutil.copytree(package, lib / "clover_agent", ignore=shutil.ignore_patterns("__pycache__"))
    if not (lib / "clover_agent" / "sandboxes" / "runner.py").is_file():
        raise InstallError(f"clover-agent's package at {package} is not whole (no sandboxes/runner.py)")
    code = (
        f"import sys; sys.path.insert(0, {CONTAINER_HOME + '/lib'!r}); sys.argv[0] = 'clover-agent'; "
        "from clover_agent.cli import main; sys.exit(main())"
    )
    launcher = into / "bin" / "clover-agent"
    launcher.parent.mkdir(parents=True)
    launcher.write_text(f'#!/bin/sh\nexec {shlex.quote(python_path)} -I -c {shlex.quote(code)} "$@"\n')
    launcher.chmod(0o755)
    _readable_by_all(into)
    return into


def _readable_by_all(root: Path) -> None:
    """Every file readable and every folder listable by any user: the task's agent user may not be
    root, and the folders made by ``mkdtemp`` (the library cache) are private to their owner."""
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        path.chmod(mode | 0o444 | (0o111 if path.is_dir() else 0))
