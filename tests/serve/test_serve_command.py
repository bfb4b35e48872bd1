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

from clover_agent.errors import UsageError
from clover_agent.serve.server import bind
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


def test_an_empty_or_blank_api_key_is_refused_not_taken_for_none(real_vocab_checkpoint: Path) -> None:
    """``--api-key "$KEY"`` with KEY unset must not serve without a key (nor with one that a bare
    ``Authorization: Bearer`` matches), on loopback or beyond."""
    for host, key in (("127.0.0.1", ""), ("0.0.0.0", "   ")):
        done = run_cli(
            "serve", "--model", str(real_vocab_checkpoint), "--host", host, "--port", "0", "--api-key", key,
            env={"CLOVER_API_KEY": "sk-from-the-environment"},
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert "the API key is empty or blank" in done.stderr
        assert "loading weights" not in done.stderr  # refused before the load


def test_an_api_key_no_client_can_send_is_refused_before_the_load(real_vocab_checkpoint: Path) -> None:
    """A key travels in an HTTP header: one with characters beyond printable ASCII (clients refuse
    or mangle them; the server reads headers as Latin-1), or with spaces at either end (stripped
    from the header), could never match, and every client would get 401 with the right key."""
    for key in ("clé-secrète-0123456789", "sk-\x07bell", " sk-padded-key", "sk-padded-key\t"):
        done = run_cli(
            "serve", "--model", str(real_vocab_checkpoint), "--port", "0", "--api-key", key,
            env={"CLOVER_API_KEY": ""},
        )  # fmt: skip
        assert done.returncode == 2, (key, done.stderr)
        assert "printable ASCII" in done.stderr and "loading weights" not in done.stderr


def test_a_port_out_of_range_is_a_usage_error_before_the_load(real_vocab_checkpoint: Path) -> None:
    for bad in ("70000", "-1"):
        done = run_cli(
            "serve", "--model", str(real_vocab_checkpoint), "--port", bad, env={"CLOVER_API_KEY": ""}
        )
        assert done.returncode == 2, done.stderr
        assert "must be a port from 0 to 65535" in done.stderr and "Traceback" not in done.stderr
        assert "loading weights" not in done.stderr
    with pytest.raises(UsageError, match=re.escape("cannot listen on 127.0.0.1:70000")):
        bind("127.0.0.1", 70000)  # the library's callers (serving_in_thread) too


def _metric(base: str, name: str) -> float:
    for line in http("GET", base + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


def _start_serve(
    model_dir: Path, log: Path, drain_timeout: float, *extra: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, str]:
    """``clover-agent serve`` in its own process on a free port: the process and its base URL."""
    process = start_signalable(
        [sys.executable, "-m", "clover_agent", "serve", "--model", str(model_dir), "--port", "0",
         "--drain-timeout", str(drain_timeout), *extra],
        stdout=subprocess.DEVNULL, stderr=log.open("w"),
        env={**os.environ, "CLOVER_API_KEY": "", **(env or {})},
    )  # fmt: skip
    listening = re.compile(r"on (http://127\.0\.0\.1:\d+)/v1")
    wait_for(lambda: listening.search(log.read_text()) or process.poll() is not None, "the server to listen")
    found = listening.search(log.read_text())
    assert found, log.read_text()
    return process, found.group(1)


class Streamer(threading.Thread):
    """A streamed request read in a thread: ``outcome`` is its finish reason, ``error: ...`` when
    the server said so in the stream, or ``closed`` when this side closed it (:meth:`hang_up`)."""

    def __init__(self, base: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
        self.stream = client.chat.completions.create(
            model="clover", messages=USER, max_tokens=max_tokens, stream=True
        )
        self.outcome: str | None = None
        self.hung_up = False

    def run(self) -> None:
        try:
            chunks = list(self.stream)
        except openai.APIError as error:
            self.outcome = f"error: {error.message}"
            return
        except Exception:  # the connection this side closed
            self.outcome = "closed"
            return
        if self.hung_up:
            self.outcome = "closed"
            return
        ends = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        self.outcome = ends[0] if ends else "no end"

    def hang_up(self) -> None:
        self.hung_up = True
        self.stream.close()


def test_sigterm_drains_then_exits_0(real_vocab_checkpoint: Path, tmp_path: Path) -> None:
    """While a long request keeps the drain going, new requests and /health get 503 and a short
    running request finishes; once the long one's client leaves, the process exits 0."""
    process, base = _start_serve(real_vocab_checkpoint, tmp_path / "serve.log", drain_timeout=DEADLINE_S * 5)
    try:
        long, short = Streamer(base, 4000), Streamer(base, 40)
        long.start()
        short.start()
        wait_for(lambda: _metric(base, "clover_running_requests") == 2, "both requests to run")
        process.send_signal(signal.SIGTERM)
        wait_for(lambda: http("GET", base + "/health").status == 503, "the drain to start")
        assert http("GET", base + "/health").json() == {"status": "draining"}
        client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.InternalServerError) as refused:
            client.chat.completions.create(model="clover", messages=USER, max_tokens=4)
        assert refused.value.status_code == 503 and refused.value.code == "draining"
        short.join(DEADLINE_S)
        assert short.outcome == "length"  # a running request finished during the drain
        assert process.poll() is None  # the long one still runs: the server waits for it
        long.hang_up()
        assert process.wait(DEADLINE_S) == 0
        log = (tmp_path / "serve.log").read_text()
        assert "draining: 2 running" in log
        assert "memory plan: none on the CPU; 8 request(s) decoded together" in log
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_drain_that_runs_out_of_time_cancels_and_says_so(
    real_vocab_checkpoint: Path, tmp_path: Path
) -> None:
    process, base = _start_serve(real_vocab_checkpoint, tmp_path / "serve.log", drain_timeout=1)
    try:
        long = Streamer(base, 4000)
        long.start()
        wait_for(lambda: _metric(base, "clover_running_requests") == 1, "the request to run")
        process.send_signal(signal.SIGTERM)
        assert process.wait(DEADLINE_S) == 0
        long.join(DEADLINE_S)
        assert long.outcome == "error: the server shut down before the answer was complete"
        assert "drain timed out" in (tmp_path / "serve.log").read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize(
    ("extra", "env"), [(("--experts", "int4"), {}), ((), {"CLOVER_EXPERTS": "int4"})], ids=["flag", "env"]
)
def test_int4_experts_are_loaded_and_served(
    real_vocab_checkpoint: Path, tmp_path: Path, extra: tuple[str, ...], env: dict[str, str]
) -> None:
    """``--experts int4`` (or CLOVER_EXPERTS) quantises the routed experts while loading, which is
    what fits Clover on a 24 GB card, and the server answers with them."""
    log = tmp_path / "serve.log"
    process, base = _start_serve(real_vocab_checkpoint, log, 10.0, *extra, env=env)
    try:
        client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
        answer = client.chat.completions.create(model="clover", messages=USER, max_tokens=8, temperature=0)
        assert answer.choices[0].finish_reason == "length" and answer.usage is not None
        assert answer.usage.completion_tokens == 8
        assert "routed experts: int4" in log.read_text()
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(DEADLINE_S) == 0


@pytest.mark.parametrize(
    ("extra", "env"),
    [(("--experts-on", "host"), {}), ((), {"CLOVER_EXPERTS_ON": "host"})],
    ids=["flag", "env"],
)
def test_experts_in_host_memory_are_loaded_and_served(
    real_vocab_checkpoint: Path, tmp_path: Path, extra: tuple[str, ...], env: dict[str, str]
) -> None:
    """``--experts-on host`` (or CLOVER_EXPERTS_ON) puts the routed experts in host memory, computed
    by the CPU (what fits a 16 GB card), and the server answers with them."""
    log = tmp_path / "serve.log"
    process, base = _start_serve(real_vocab_checkpoint, log, 10.0, *extra, env=env)
    try:
        client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
        answer = client.chat.completions.create(model="clover", messages=USER, max_tokens=8, temperature=0)
        assert answer.usage is not None and answer.usage.completion_tokens == 8
        assert "in host memory, computed there by the CPU" in log.read_text()
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(DEADLINE_S) == 0


@pytest.mark.parametrize(
    ("variable", "value", "flag", "choices"),
    [
        ("CLOVER_EXPERTS", "int3", "--experts", "auto, dense, fp8, int4"),
        ("CLOVER_EXPERTS_ON", "gpu", "--experts-on", "device, host"),
    ],
    ids=["experts", "experts-on"],
)
def test_an_unknown_experts_setting_is_refused_before_the_load(
    real_vocab_checkpoint: Path, variable: str, value: str, flag: str, choices: str
) -> None:
    """From the environment: exit 2 naming the variable and the choices; from the flag: argparse's
    "invalid choice". Neither reads the weights."""
    serve = ("serve", "--model", str(real_vocab_checkpoint), "--port", "0")
    done = run_cli(*serve, env={variable: value})
    assert done.returncode == 2, done.stderr
    assert f"{variable} = {value!r}: choose one of {choices}" in done.stderr
    assert "loading weights" not in done.stderr and "Traceback" not in done.stderr
    flagged = run_cli(*serve, flag, value)
    assert flagged.returncode == 2 and f"invalid choice: {value!r}" in flagged.stderr
