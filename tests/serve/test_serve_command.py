"""``clover-agent serve`` as a user runs it: a process of its own, stopped by SIGTERM after a
drain (new requests 503, running ones finish, exit 0); no API key beyond loopback is refused."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import openai
import pytest

from tests.cli_process import run_cli, start_signalable
from tests.serve.servers import DEADLINE_S, http, wait_for

pytestmark = pytest.mark.slow

USER = [{"role": "user", "content": "hello"}]


def test_listening_beyond_loopback_needs_an_api_key(real_vocab_checkpoint: Path) -> None:
    env = {"CLOVER_API_KEY": ""}
    done = run_cli(
        "serve", "--model", str(real_vocab_checkpoint), "--host", "0.0.0.0", "--port", "0", env=env
    )
    assert done.returncode == 2
    assert "--api-key KEY or CLOVER_API_KEY" in done.stderr and "--host 127.0.0.1" in done.stderr
    assert "loading weights" not in done.stderr  # refused before the load


def _metric(base: str, name: str) -> float:
    for line in http("GET", base + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


def test_sigterm_drains_then_exits_0(real_vocab_checkpoint: Path, tmp_path: Path) -> None:
    log = (tmp_path / "serve.log").open("w+")
    process = start_signalable(
        [sys.executable, "-m", "clover_agent", "serve", "--model", str(real_vocab_checkpoint), "--port", "0",
         "--drain-timeout", "20"],
        stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, "CLOVER_API_KEY": ""},
    )  # fmt: skip
    try:
        shown = lambda: re.search(r"on (http://127\.0\.0\.1:\d+)/v1", Path(log.name).read_text())  # noqa: E731
        wait_for(shown, "the server to listen")
        base = shown().group(1)  # type: ignore[union-attr]
        client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
        outcomes: dict[str, str | None] = {}

        def ask(name: str, max_tokens: int) -> None:
            stream = client.chat.completions.create(
                model="clover", messages=USER, max_tokens=max_tokens, stream=True
            )
            try:
                chunks = list(stream)
            except openai.APIError as error:  # the server said so in the stream
                outcomes[name] = f"error: {error.message}"
                return
            outcomes[name] = next(
                (c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason), None
            )

        short = threading.Thread(target=ask, args=("short", 40))
        long = threading.Thread(target=ask, args=("long", 4000))
        long.start()
        short.start()
        wait_for(lambda: _metric(base, "clover_running_requests") == 2, "both requests to run")
        process.send_signal(signal.SIGTERM)
        wait_for(lambda: http("GET", base + "/health").status == 503, "the drain to start")
        assert http("GET", base + "/health").json() == {"status": "draining"}
        with pytest.raises(openai.InternalServerError) as refused:
            client.chat.completions.create(model="clover", messages=USER, max_tokens=4)
        assert refused.value.status_code == 503 and refused.value.code == "draining"
        short.join(DEADLINE_S)
        assert outcomes["short"] == "length"  # a running request finished during the drain
        assert process.wait(DEADLINE_S) == 0
        long.join(DEADLINE_S)
        # cut when the drain's 20 s ran out, and told so
        assert outcomes["long"] == "error: the server shut down before the answer was complete"
        text = Path(log.name).read_text()
        assert "draining: 2 running" in text and "drain timed out" in text
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
