"""What a web page in the user's browser can send a server with no key (loopback only): a POST
whose body is not declared JSON needs no CORS preflight, and a page that rebinds its own domain to
127.0.0.1 (DNS rebinding) reads the answers. Neither may use the model or read the server."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from clover_agent.serve.app import Served
from clover_agent.serve.server import serving_in_thread
from tests.serve.servers import DEADLINE_S, Reply, served_model

pytestmark = pytest.mark.slow

BODY = json.dumps({"model": "clover", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})


@pytest.fixture(scope="module")
def keyless(real_vocab_checkpoint: Path) -> Iterator[tuple[Served, str]]:
    served = served_model(real_vocab_checkpoint, max_running=2)
    with serving_in_thread(served) as base_url:
        yield served, base_url


def _send(base_url: str, method: str, path: str, headers: dict[str, str], body: str | None = None) -> Reply:
    """One request with exactly ``headers`` (no Content-Type or Host added for us)."""
    host, port = base_url.removeprefix("http://").removesuffix("/v1").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=DEADLINE_S)
    try:
        connection.putrequest(method, path, skip_host="Host" in headers, skip_accept_encoding=True)
        data = body.encode() if body is not None else b""
        for name, value in {**headers, "Content-Length": str(len(data))}.items():
            connection.putheader(name, value)
        connection.endheaders(data)
        response = connection.getresponse()
        return Reply(response.status, dict(response.getheaders()), response.read().decode())
    finally:
        connection.close()


def test_a_body_not_declared_json_is_415(keyless: tuple[Served, str]) -> None:
    """What a form or ``fetch(..., {mode: "no-cors"})`` sends (text/plain, a form, no type at all)
    was decoded and answered: any page could use the model without the browser asking first."""
    served, base_url = keyless
    completed = served.metrics.outcomes["completed"]
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
        headers: dict[str, str] = {} if kind is None else {"Content-Type": kind}
        reply = _send(base_url, "POST", "/v1/chat/completions", headers, BODY)
        assert reply.status == 415, (kind, reply.text[:200])
        assert reply.json()["error"]["type"] == "invalid_request_error"
    assert served.metrics.outcomes["completed"] == completed
    for kind in ("application/json", "application/json; charset=utf-8", "Application/JSON"):
        reply = _send(base_url, "POST", "/v1/chat/completions", {"Content-Type": kind}, BODY)
        assert reply.status == 200, (kind, reply.text[:200])


def test_without_a_key_only_this_machine_s_names_are_served(keyless: tuple[Served, str]) -> None:
    """A rebound page's requests carry its own domain in Host: refused on every endpoint, while
    the names of this machine are served."""
    _, base_url = keyless
    port = base_url.rsplit(":", 1)[1].removesuffix("/v1")
    json_body = {"Content-Type": "application/json"}
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}"):
        for method, path, body in (("POST", "/v1/chat/completions", BODY), ("GET", "/v1/models", None),
                                   ("GET", "/metrics", None), ("GET", "/health", None)):  # fmt: skip
            reply = _send(base_url, method, path, {"Host": host, **json_body}, body)
            assert reply.status == 403, (host, path, reply.text[:200])
            assert reply.json()["error"]["code"] == "host_not_allowed"
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}", "127.0.0.2"):
        reply = _send(base_url, "GET", "/v1/models", {"Host": host})
        assert reply.status == 200, (host, reply.text[:200])
