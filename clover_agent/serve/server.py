"""Running the app: uvicorn on a socket bound here (so ``--port 0`` is told), the API-key rule
(required unless the server listens on loopback only), and the drain: on SIGTERM (or a first
Ctrl-C) the server answers 503 to new requests, lets the running ones finish for up to
``drain_timeout`` seconds (cancelling what is left after that), then stops."""

from __future__ import annotations

import logging
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TextIO

import uvicorn

from clover_agent.errors import UsageError
from clover_agent.serve.app import Served, build_app, is_loopback

log = logging.getLogger("clover_agent.serve")

#: Seconds a drain waits for running requests before cancelling them.
DEFAULT_DRAIN_TIMEOUT_S = 60.0
#: Seconds uvicorn waits for open connections once the drain is over.
CONNECTIONS_TIMEOUT_S = 10.0


def check_api_key(host: str, api_key: str | None) -> None:
    """A :class:`UsageError` naming the fix when the server would listen beyond this machine
    without an API key, or when the key is blank (a client sending ``Bearer`` alone would match it)
    or one no client can send in a header (beyond printable ASCII, spaces at either end)."""
    if api_key is not None and not api_key.strip():
        raise UsageError("the API key is empty or blank: give a real one (--api-key KEY or CLOVER_API_KEY)")
    if api_key is not None and (not all(" " <= c <= "~" for c in api_key) or api_key != api_key.strip()):
        raise UsageError(
            "the API key must be printable ASCII with no space at either end: clients send it in an "
            "HTTP header, and no client could send this one (e.g. `openssl rand -hex 24` makes one)"
        )
    if api_key is None and not is_loopback(host):
        raise UsageError(
            f"serving on {host} lets other machines in: give it an API key (--api-key KEY or "
            "CLOVER_API_KEY), or listen on 127.0.0.1 only (--host 127.0.0.1)"
        )


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except (OSError, OverflowError) as exc:  # OverflowError: a port past 65535
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {getattr(exc, 'strerror', None) or exc}") from None
    sock.listen(2048)
    return sock


class DrainingServer(uvicorn.Server):
    """uvicorn, with its exit signal turned into a drain; a second signal stops at once."""

    def __init__(self, config: uvicorn.Config, served: Served, drain_timeout: float, out: TextIO) -> None:
        super().__init__(config)
        self.served = served
        self.drain_timeout = drain_timeout
        self.out = out

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.served.draining:
            self.force_exit = True
            super().handle_exit(sig, frame)
            return
        self.served.draining = True
        threading.Thread(target=self._drain, name="clover-serve-drain", daemon=True).start()

    def _drain(self) -> None:
        stats = self.served.batch.stats()
        print(
            f"clover-agent serve: draining: {stats.running} running, {stats.queued} waiting "
            f"(up to {self.drain_timeout:g} s)",
            file=self.out,
            flush=True,
        )
        if not self.served.batch.close(drain=True, timeout=self.drain_timeout):
            print("clover-agent serve: drain timed out; cancelling what is left", file=self.out, flush=True)
            self.served.batch.close(drain=False, timeout=CONNECTIONS_TIMEOUT_S)
        self.should_exit = True


def serve(
    served: Served,
    host: str,
    port: int,
    *,
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT_S,
    out: TextIO = sys.stderr,
) -> None:
    """Serve until a signal's drain ends (blocking)."""
    check_api_key(host, served.api_key)
    sock = bind(host, port)
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(
        build_app(served),
        log_level="warning",
        timeout_graceful_shutdown=int(CONNECTIONS_TIMEOUT_S),
        lifespan="off",
    )
    server = DrainingServer(config, served, drain_timeout, out)
    shown = f"[{host}]" if ":" in host else host
    names = ", ".join(served.names)
    print(f"clover-agent serve: serving {names} on http://{shown}:{bound_port}/v1", file=out, flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        served.batch.close(drain=False, timeout=CONNECTIONS_TIMEOUT_S)


@contextmanager
def serving_in_thread(served: Served, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """The server in a thread of this process (tests, benchmarks): its API root while the block
    runs; then the batch engine is closed (requests left are cancelled) and the server stopped."""
    sock = bind(host, port)
    server = uvicorn.Server(uvicorn.Config(build_app(served), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="clover-serve", daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the server stopped while starting")
            thread.join(0.02)
        yield f"http://{host}:{sock.getsockname()[1]}/v1"
    finally:
        served.batch.close(drain=False, timeout=CONNECTIONS_TIMEOUT_S)
        server.should_exit = True
        thread.join(CONNECTIONS_TIMEOUT_S * 2)
        sock.close()
