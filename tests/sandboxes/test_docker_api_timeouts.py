"""A Docker engine that stops answering ends a run with exit 4 and one message, never a ``requests``
traceback, and leaves no container behind.

The engine is the real one, reached through a proxy socket this test starts: it forwards every
request, but once a request of the chosen kind has passed, it withholds the engine's answers on that
connection. The engine still does the work (the container is created, the archive copied), exactly
as when a loaded engine answers too late.
"""

from __future__ import annotations

import os
import re
import socket
import threading
from pathlib import Path

import pytest

from clover_agent.cli import main
from clover_agent.errors import ExitCode
from clover_agent.sandboxes.docker import LABEL_OWNER_PID, docker_client
from tests.clover_agent.fix.test_fix import calculator_repo
from tests.clover_agent.test_agent_loop import call, write_replay

pytestmark = [pytest.mark.slow, pytest.mark.docker]

ENGINE = "/var/run/docker.sock"


class HoldingProxy:
    """A Unix socket at ``path`` in front of the engine's; after a request matching ``hold`` on a
    connection, that connection's answers are read from the engine and dropped."""

    def __init__(self, path: Path, hold: bytes) -> None:
        self.path, self.hold = path, re.compile(hold, re.M)
        self.held = threading.Event()  # a request was held
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        self._server.listen(64)
        self._open: list[socket.socket] = [self._server]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            engine.connect(ENGINE)
            self._open += [client, engine]
            holding = threading.Event()
            threading.Thread(target=self._pump, args=(client, engine, holding, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(engine, client, holding, False), daemon=True).start()

    def _pump(
        self, source: socket.socket, sink: socket.socket, holding: threading.Event, requests: bool
    ) -> None:
        try:
            while data := source.recv(65536):
                if requests and self.hold.search(data):
                    holding.set()
                    self.held.set()
                if requests or not holding.is_set():
                    sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        for s in self._open:
            s.close()


def own_containers() -> list[dict]:
    client = docker_client(dict(os.environ))
    try:
        return client.api.containers(all=True, filters={"label": f"{LABEL_OWNER_PID}={os.getpid()}"})
    finally:
        client.close()


@pytest.mark.parametrize(
    ("hold", "what"),
    [
        (rb"^POST /v[\d.]+/containers/create", "creating the sandbox container"),
        (rb"^PUT /v[\d.]+/containers/\w+/archive", "copying the repository into the sandbox"),
    ],
)
def test_an_engine_that_stops_answering_ends_the_run_with_exit_4_and_no_leftover(
    hold: bytes, what: str, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not os.path.exists(ENGINE):
        pytest.skip(f"no Docker engine socket at {ENGINE}")
    assert own_containers() == []
    proxy = HoldingProxy(tmp_path / "engine.sock", hold)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{proxy.path}")
    monkeypatch.setenv("CLOVER_DOCKER_TIMEOUT", "12")
    repo = calculator_repo(tmp_path)
    replay = write_replay(tmp_path / "replay.jsonl", [call("finish", summary="nothing")])
    try:
        code = main(["fix", "test_add", "--repo", str(repo), "--backend", "replay", "--replay", str(replay),
                     "--sandbox", "docker", "--yes"])  # fmt: skip
    finally:
        proxy.close()
    out = capsys.readouterr()
    assert proxy.held.is_set()
    assert code == ExitCode.SANDBOX_UNAVAILABLE, out.out + out.err
    assert "Traceback" not in out.out + out.err and "ReadTimeout" not in out.err
    messages = [line for line in out.err.splitlines() if line.startswith("clover-agent:")]
    assert (
        len(messages) == 1
        and f"the Docker engine did not answer while {what} (no answer within 12 s)" in messages[0]
    )
    monkeypatch.delenv("DOCKER_HOST")
    assert own_containers() == []  # the container the engine made all the same is gone
