"""Shared test set-up: resource detection for the ``docker``, ``index`` and ``gpu`` markers.

A test that needs a missing resource is skipped with a printed reason (``-ra`` prints it). In CI
(``CLOVER_REQUIRE_DOCKER=1``, set by ``.ci/run``) a missing Docker engine is an error instead, so
Docker tests can never be skipped silently there. ``index`` tests (environments set up from the
package index, with this machine's pip configuration) are skipped only when the index cannot be
reached from here. The local sandbox's runs find a clean Python first on PATH
(:mod:`tests.local_python`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os

import pytest
import torch

# Triton reads TRITON_INTERPRET when a kernel is decorated (at import), and engine tests import the
# kernels long before tests/kernels/ is collected: without a GPU, the interpreter is set up here,
# before any test module is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from clover_agent.settings import DEFAULT_SANDBOX_IMAGE
from tests import local_python

#: How long Textual's test pilot waits for an app's widgets to process what is pending after a key
#: press or a pause (its own default: 30 s). A loaded CI machine (three test workers on two cores,
#: Docker builds beside them) has gone past 30 s in TUI tests that take one second alone; an app
#: that never settles still fails, later.
PILOT_SETTLE_S = 120.0


def _patient_pilot() -> None:
    from textual.pilot import Pilot

    settle = Pilot._wait_for_screen

    @functools.wraps(settle)
    async def patient(self: Pilot, timeout: float = PILOT_SETTLE_S) -> bool:
        settling = asyncio.ensure_future(settle(self, timeout=max(timeout, PILOT_SETTLE_S)))
        while not (await asyncio.wait({settling}, timeout=0.05))[0]:
            # An app that has handled its exit (ctrl+q) never runs what is queued behind its end mark,
            # so a pilot that queued its callbacks there would wait out the whole timeout, then fail.
            if self.app._exit:
                settling.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await settling
                return True
        return settling.result()

    Pilot._wait_for_screen = patient  # type: ignore[method-assign]


_patient_pilot()


@functools.cache
def docker_problem() -> str | None:
    """None when a Docker engine answers and the sandbox image exists, else the reason."""
    try:
        import docker
        from docker.errors import DockerException, ImageNotFound
    except ImportError as exc:
        return f"docker package missing: {exc}"
    try:
        client = docker.from_env(timeout=5)
        client.ping()
    except DockerException as exc:
        return f"no Docker engine answers: {exc}"
    image = os.environ.get("CLOVER_SANDBOX_IMAGE", DEFAULT_SANDBOX_IMAGE)
    try:
        client.images.get(image)
    except ImageNotFound:
        return f"sandbox image {image} not built (run `clover-agent sandbox build`)"
    return None


@functools.cache
def index_problem() -> str | None:
    """None when the package index this machine's pip uses answers (with pip's CA bundle)."""
    import ssl
    import urllib.request

    from clover_agent.settings import host_package_index

    index = host_package_index(os.environ)
    url = (index.index_url or "https://pypi.org/simple/").rstrip("/") + "/pip/"
    context = ssl.create_default_context(
        cadata=index.ca_bundle.decode("ascii", "replace") if index.ca_bundle else None
    )
    try:
        with urllib.request.urlopen(url, timeout=20, context=context) as response:
            response.read(1)
    except (OSError, ValueError) as exc:
        return f"the package index {url} cannot be reached from this machine ({exc})"
    return None


@pytest.fixture(autouse=True)
def own_state_folder(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Each test has its own user folder (the record key, the trusted repositories): no test reads
    or writes the real one, and a key one test made signs nothing another test reads."""
    folder = tmp_path_factory.mktemp("clover-state")
    monkeypatch.setenv("CLOVER_STATE", str(folder))
    return folder


@functools.cache
def gpu_problem() -> str | None:
    import torch

    return None if torch.cuda.is_available() else "no CUDA GPU"


def pytest_sessionstart(session: pytest.Session) -> None:
    # Once, before any pytest-xdist worker starts (a worker's error would read as a crash; the
    # workers inherit the PATH set here).
    if hasattr(session.config, "workerinput"):
        return
    if os.environ.get("CLOVER_REQUIRE_DOCKER") == "1" and docker_problem():
        raise pytest.UsageError(f"CLOVER_REQUIRE_DOCKER=1 but {docker_problem()}")
    local_python.put_first_on_path()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("docker") and docker_problem():
            item.add_marker(pytest.mark.skip(reason=f"docker: {docker_problem()}"))
        if item.get_closest_marker("index") and index_problem():
            item.add_marker(pytest.mark.skip(reason=f"index: {index_problem()}"))
        if item.get_closest_marker("gpu") and gpu_problem():
            item.add_marker(pytest.mark.skip(reason=f"gpu: {gpu_problem()}"))
