"""A small OpenAI-compatible chat server for one GGUF model on the CPU, for `clover-agent eval`
against a real (if weak) language model: `POST /v1/chat/completions` (streamed or not) and
`GET /v1/models`, standard library HTTP plus transformers' GGUF loader and the model's chat template.

Used where `transformers serve` cannot load the GGUF (its config carries no architecture). The
offered tools are written into the system message with the `<tool_call><function=...>` format,
as a tool-aware chat template would; the text comes back unparsed, so the client's own parser
reads the calls. The oldest turns (never the system message) are dropped to fit the model's
context window. Run: `python bench/small_model_server.py --gguf FILE --port 8765`.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TextIteratorStreamer

TOOL_FORMAT = (
    "To call a tool, write exactly this, one block per call, after any text:\n"
    "<tool_call>\n<function=TOOL_NAME>\n<parameter=PARAMETER_NAME>\nVALUE\n</parameter>\n"
    "</function>\n</tool_call>"
)


def tools_text(tools: list[dict[str, Any]]) -> str:
    """The offered tools, briefly: name, description, parameters (required ones marked)."""
    lines = ["You can call these tools:"]
    for spec in tools:
        fn = spec.get("function", spec) if isinstance(spec, dict) else {}
        params = fn.get("parameters") or {}
        required = set(params.get("required") or ())
        names = [f"{key}{'' if key in required else '?'}" for key in (params.get("properties") or {})]
        description = str(fn.get("description") or "").strip().splitlines()[:1]
        lines.append(f"- {fn.get('name')}({', '.join(names)}): {' '.join(description)}")
    return "\n".join(lines) + "\n\n" + TOOL_FORMAT


def _text(content: Any) -> str:
    if isinstance(content, list):  # content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _call_text(call: dict[str, Any]) -> str:
    fn = call.get("function") or {}
    try:
        arguments = json.loads(fn.get("arguments") or "{}")
    except ValueError:
        arguments = {}
    params = "".join(
        f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
        for k, v in (arguments.items() if isinstance(arguments, dict) else ())
    )
    return f"<tool_call>\n<function={fn.get('name')}>\n{params}</function>\n</tool_call>"


def plain_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Messages as the plain template takes them: system, user and assistant text only."""
    out: list[dict[str, str]] = []
    for m in messages:
        role, text = m.get("role"), _text(m.get("content"))
        if role == "assistant":
            calls = [_call_text(c) for c in m.get("tool_calls") or () if isinstance(c, dict)]
            out.append({"role": "assistant", "content": "\n".join([text, *calls]).strip()})
        elif role == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{text}\n</tool_response>"})
        else:
            out.append({"role": "system" if role == "system" else "user", "content": text})
    if tools:
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + tools_text(tools)}
        else:
            out.insert(0, {"role": "system", "content": tools_text(tools)})
    return out


class Model:
    def __init__(self, gguf: Path, max_new_tokens: int, temperature: float = 0.0) -> None:
        self.name = gguf.stem
        self.tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        self.model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
        self.model.eval()
        self.window = int(getattr(self.model.config, "max_position_embeddings", 2048))
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature  # where the request gives none; 0: greedy
        self.lock = threading.Lock()  # one generation at a time: two CPU cores

    def prompt_ids(self, messages: list[dict[str, str]], new_tokens: int) -> tuple[torch.Tensor, int]:
        """The prompt's token ids, the oldest non-system turns dropped until it fits; and how many
        turns were dropped."""
        dropped = 0
        while True:
            ids = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, return_tensors="pt"
            )
            if not isinstance(ids, torch.Tensor):
                ids = ids["input_ids"]
            keep = 1 if messages and messages[0]["role"] == "system" else 0
            if ids.shape[1] + new_tokens <= self.window or len(messages) <= keep + 1:
                return ids[:, -(self.window - new_tokens) :], dropped
            messages = messages[:keep] + messages[keep + 1 :]
            dropped += 1

    def generate(self, body: dict[str, Any], on_text: Any) -> dict[str, Any]:
        new_tokens = min(int(body.get("max_tokens") or self.max_new_tokens), self.max_new_tokens)
        messages = plain_messages(body.get("messages") or [], body.get("tools") or [])
        given = body.get("temperature")
        temperature = float(self.temperature if given is None else given)
        with self.lock:
            ids, dropped = self.prompt_ids(messages, new_tokens)
            streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
            kwargs: dict[str, Any] = {"max_new_tokens": new_tokens, "streamer": streamer}
            kwargs.update(
                {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
            )
            result: dict[str, Any] = {}

            def run() -> None:
                with torch.no_grad():
                    result["out"] = self.model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)

            worker = threading.Thread(target=run, daemon=True)
            worker.start()
            for piece in streamer:
                on_text(piece)
            worker.join()
        new = result["out"][0, ids.shape[1] :]
        finished = bool(len(new)) and int(new[-1]) == self.tokenizer.eos_token_id
        return {
            "prompt_tokens": int(ids.shape[1]),
            "completion_tokens": len(new),
            "finish_reason": "stop" if finished or len(new) < new_tokens else "length",
            "dropped_turns": dropped,
        }


def handler(model: Model) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            sys.stderr.write(f"{time.strftime('%H:%M:%S')} {format % args}\n")

        def _json(self, status: int, data: dict[str, Any]) -> None:
            payload = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": model.name, "object": "model"}]})
            else:
                self._json(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._json(404, {"error": {"message": f"no route {self.path}"}})
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                if not isinstance(body, dict):
                    raise ValueError("the body is not a JSON object")
            except ValueError as exc:
                self._json(400, {"error": {"message": f"bad request: {exc}"}})
                return
            ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
            base = {"id": ident, "created": created, "model": model.name}
            started = time.monotonic()
            if not body.get("stream"):
                pieces: list[str] = []
                info = model.generate(body, pieces.append)
                self._json(200, self._final(base, "".join(pieces), info))
            else:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True

                def send(data: dict[str, Any]) -> None:
                    self.wfile.write(f"data: {json.dumps(data)}\n\n".encode())
                    self.wfile.flush()

                def piece(text: str) -> None:
                    if text:
                        delta = {"role": "assistant", "content": text}
                        send(
                            {
                                **base,
                                "object": "chat.completion.chunk",
                                "choices": [{"index": 0, "delta": delta}],
                            }
                        )

                try:
                    info = model.generate(body, piece)
                    end = {"index": 0, "delta": {}, "finish_reason": info["finish_reason"]}
                    send({**base, "object": "chat.completion.chunk", "choices": [end]})
                    send(
                        {**base, "object": "chat.completion.chunk", "choices": [], "usage": self._usage(info)}
                    )
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):  # the client gave up
                    return
            took = time.monotonic() - started
            sys.stderr.write(
                f"  {info['prompt_tokens']} prompt + {info['completion_tokens']} new tokens in {took:.1f}s "
                f"({info['finish_reason']}; {info['dropped_turns']} old turn(s) dropped)\n"
            )

        @staticmethod
        def _usage(info: dict[str, Any]) -> dict[str, int]:
            return {
                "prompt_tokens": info["prompt_tokens"],
                "completion_tokens": info["completion_tokens"],
                "total_tokens": info["prompt_tokens"] + info["completion_tokens"],
            }

        def _final(self, base: dict[str, Any], text: str, info: dict[str, Any]) -> dict[str, Any]:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": info["finish_reason"],
            }
            return {**base, "object": "chat.completion", "choices": [choice], "usage": self._usage(info)}

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, required=True, help="the model's .gguf file")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--max-new-tokens", type=int, default=256, help="cap on each answer's tokens")
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="where a request gives none (0: greedy)"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = Model(args.gguf, args.max_new_tokens, args.temperature)
    server = ThreadingHTTPServer((args.host, args.port), handler(model))
    print(f"serving {model.name} (window {model.window}) on http://{args.host}:{args.port}/v1", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
