"""A small stand-in for the GitHub Actions runner: it evaluates the workflows' and the action's
``if:`` conditions and ``${{ }}`` values, runs each ``run:`` block with bash as the runner does
(an event payload file, ``GITHUB_*`` variables, ``GITHUB_OUTPUT``), and a local HTTP server plays
GitHub's REST API, recording every call. ``uses:`` steps of other actions are named stand-ins
(checkout clones the local "server" repository); everything in ``run:`` is executed for real."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

# --- the REST API -------------------------------------------------------------------------------


@dataclass
class FakeGitHub:
    """GitHub's REST API for one repository: collaborators' permissions, pull requests, issue
    comments. ``calls`` records (method, path, body) of every request."""

    repo: str
    permissions: dict[str, str] = field(default_factory=dict)
    pulls: dict[int, dict[str, Any]] = field(default_factory=dict)
    comments: dict[int, dict[str, Any]] = field(default_factory=dict)
    calls: list[tuple[str, str, Any]] = field(default_factory=list)
    created_pulls: list[dict[str, Any]] = field(default_factory=list)
    replies: list[dict[str, Any]] = field(default_factory=list)  # answers in review threads
    check_runs: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        prefix = f"/repos/{self.repo}"
        if not path.startswith(prefix + "/"):
            return 404, {"message": "Not Found"}
        rest = path[len(prefix) :]
        if m := re.fullmatch(r"/collaborators/([^/]+)/permission", rest):
            if method == "GET" and m[1] in self.permissions:
                return 200, {"permission": self.permissions[m[1]], "user": {"login": m[1]}}
            return 404, {"message": "Not Found"}  # as GitHub answers for an App or a stranger
        if (m := re.fullmatch(r"/pulls/(\d+)", rest)) and method == "GET" and int(m[1]) in self.pulls:
            return 200, self.pulls[int(m[1])]
        if rest == "/pulls" and method == "POST":
            number = 100 + len(self.created_pulls)
            made = {**body, "number": number, "html_url": f"https://github.example/{self.repo}/pull/{number}"}
            self.created_pulls.append(made)
            return 201, made
        if (m := re.fullmatch(r"/pulls/(\d+)/comments/(\d+)/replies", rest)) and method == "POST":
            made = {**body, "pull": int(m[1]), "in_reply_to": int(m[2])}
            made["html_url"] = f"https://github.example/{self.repo}/pull/{m[1]}#discussion_r{m[2]}9"
            self.replies.append(made)
            return 201, made
        if rest == "/check-runs" and method == "POST":
            made = {
                **body,
                "html_url": f"https://github.example/{self.repo}/runs/{600 + len(self.check_runs)}",
            }
            self.check_runs.append(made)
            return 201, made
        if (m := re.fullmatch(r"/issues/(\d+)/comments", rest)) and method == "POST":
            cid = 5000 + len(self.comments)
            self.comments[cid] = {"id": cid, "issue": int(m[1]), "body": body["body"], "edits": 0}
            return 201, self.comments[cid]
        if (
            (m := re.fullmatch(r"/issues/comments/(\d+)", rest))
            and method == "PATCH"
            and int(m[1]) in self.comments
        ):
            self.comments[int(m[1])].update(body=body["body"], edits=self.comments[int(m[1])]["edits"] + 1)
            return 200, self.comments[int(m[1])]
        return 404, {"message": "Not Found"}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                assert self.headers.get("Authorization") == "Bearer test-token"
                fake.calls.append((self.command, self.path, body))
                status, answer = fake.answer(self.command, self.path, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


# --- expressions ---------------------------------------------------------------------------------

TOKEN = re.compile(r"\s*(?:(\d+)|'((?:[^']|'')*)'|(==|!=|&&|\|\||!|\(|\)|,)|([A-Za-z_][\w.-]*(?:\.[\w-]+)*))")


def evaluate(expression: str, context: dict[str, Any]) -> Any:
    """The subset of the expression language the shipped files use: dotted names, strings,
    ``==`` ``!=`` ``&&`` ``||`` ``!``, parentheses and ``always()``, ``contains()``, ``startsWith()``."""
    tokens: list[tuple[str, Any]] = []
    pos, text = 0, expression.strip()
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"cannot read {text[pos:]!r} in {expression!r}")
        pos = m.end()
        if m[1] is not None:
            tokens.append(("lit", int(m[1])))
        elif m[2] is not None:
            tokens.append(("lit", m[2].replace("''", "'")))
        elif m[3] is not None:
            tokens.append(("op", m[3]))
        else:
            tokens.append(("name", m[4]))
    i = 0

    def peek() -> tuple[str, Any] | None:
        return tokens[i] if i < len(tokens) else None

    def take() -> tuple[str, Any]:
        nonlocal i
        i += 1
        return tokens[i - 1]

    def primary() -> Any:
        kind, value = take()
        if kind == "lit":
            return value
        if (kind, value) == ("op", "!"):
            return not truthy(primary())
        if (kind, value) == ("op", "("):
            result = either()
            take()
            return result
        if peek() == ("op", "("):
            take()
            args = []
            while peek() != ("op", ")"):
                args.append(either())
                if peek() == ("op", ","):
                    take()
            take()
            return call(value, args)
        return lookup(value, context)

    def compare() -> Any:
        left = primary()
        while peek() in (("op", "=="), ("op", "!=")):
            op = take()[1]
            right = primary()
            same = (
                str(left).lower() == str(right).lower()
                if left is not None and right is not None
                else left == right
            )
            left = same if op == "==" else not same
        return left

    def both() -> Any:
        left = compare()
        while peek() == ("op", "&&"):
            take()
            right = compare()
            left = right if truthy(left) else left
        return left

    def either() -> Any:
        left = both()
        while peek() == ("op", "||"):
            take()
            right = both()
            left = left if truthy(left) else right
        return left

    return either()


def truthy(value: Any) -> bool:
    return value not in (None, False, "", 0)


def call(name: str, args: list[Any]) -> Any:
    if name == "always":
        return True
    if name == "contains":
        return str(args[1]).lower() in str(args[0] or "").lower()
    if name == "startsWith":
        return str(args[0] or "").lower().startswith(str(args[1]).lower())
    raise ValueError(f"no function {name}() in this stand-in")


def lookup(name: str, context: dict[str, Any]) -> Any:
    value: Any = context
    for part in name.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None and name.split(".")[0] in ("inputs", "steps", "vars", "secrets") else value


def interpolate(text: Any, context: dict[str, Any]) -> str:
    if not isinstance(text, str):
        return "" if text is None else str(text).lower() if isinstance(text, bool) else str(text)
    return re.sub(r"\$\{\{(.*?)\}\}", lambda m: str(evaluate(m[1], context) or ""), text)


def condition(text: Any, context: dict[str, Any]) -> bool:
    if text is None:
        return not context.get("failed")
    expression = str(text).strip()
    if expression.startswith("${{"):
        expression = expression[3:-2]
    return truthy(evaluate(expression, context))


# --- running ------------------------------------------------------------------------------------


@dataclass
class Step:
    name: str
    ran: bool
    code: int = 0
    output: str = ""
    outputs: dict[str, str] = field(default_factory=dict)


def read_outputs(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    lines = path.read_text().splitlines() if path.exists() else []
    while lines:
        line = lines.pop(0)
        if "<<" in line and "=" not in line.split("<<")[0]:
            key, delimiter = line.split("<<", 1)
            body = []
            while lines and lines[0] != delimiter:
                body.append(lines.pop(0))
            lines.pop(0)
            values[key] = "\n".join(body)
        elif "=" in line:
            key, value = line.split("=", 1)
            values[key] = value
    return values


@dataclass
class Runner:
    """One job's machine: a workspace, a temporary folder, the environment every step gets."""

    root: Path
    env: dict[str, str]
    stand_ins: dict[str, Any]
    log: list[Step] = field(default_factory=list)

    def run_block(self, name: str, script: str, step_env: dict[str, str]) -> Step:
        out = self.root / "outputs" / f"{len(self.log)}.txt"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("")
        file = self.root / "scripts" / f"{len(self.log)}.sh"
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(script)
        proc = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(file)],  # GitHub's `shell: bash`
            cwd=self.env["GITHUB_WORKSPACE"],
            env={**self.env, **step_env, "GITHUB_OUTPUT": str(out)},
            capture_output=True,
            text=True,
            timeout=900,
        )
        step = Step(name, True, proc.returncode, proc.stdout + proc.stderr, read_outputs(out))
        self.log.append(step)
        return step

    def run_steps(self, steps: list[dict[str, Any]], context: dict[str, Any]) -> dict[str, Any]:
        """Run ``steps`` in ``context`` (``steps`` outputs filled in as they go); return it."""
        context.setdefault("steps", {})
        for index, spec in enumerate(steps):
            name = spec.get("name") or str(spec.get("uses", f"step {index}")).split("@")[0]
            if not condition(spec.get("if"), context):
                self.log.append(Step(name, False))
                continue
            if "uses" in spec:
                inputs = {k: interpolate(v, context) for k, v in (spec.get("with") or {}).items()}
                handler = self.stand_ins[str(spec["uses"]).split("@")[0]]
                step = handler(self, name, inputs, context)
                self.log.append(step)
            else:
                step_env = {k: interpolate(v, context) for k, v in (spec.get("env") or {}).items()}
                step = self.run_block(name, spec["run"], step_env)
            if "id" in spec:
                context["steps"][spec["id"]] = {"outputs": step.outputs}
            if step.code != 0 and not spec.get("continue-on-error"):
                context["failed"] = True
        return context


def load_yaml(path: Path) -> dict[Any, Any]:
    data = yaml.safe_load(path.read_text())
    if True in data:  # YAML 1.1 reads `on` as True
        data["on"] = data.pop(True)
    return data


def github_env(
    runner_root: Path,
    workspace: Path,
    event_name: str,
    event_path: Path,
    api: str,
    server: str,
    repo: str,
    actor: str,
    triggering_actor: str,
) -> dict[str, str]:
    temp = runner_root / "temp"
    temp.mkdir(parents=True, exist_ok=True)
    summary = runner_root / "summary.md"
    summary.touch()
    return {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/root"),
        "CI": "true",
        "GITHUB_ACTIONS": "true",
        "GITHUB_EVENT_NAME": event_name,
        "GITHUB_EVENT_PATH": str(event_path),
        "GITHUB_API_URL": api,
        "GITHUB_SERVER_URL": server,
        "GITHUB_REPOSITORY": repo,
        "GITHUB_ACTOR": actor,
        "GITHUB_TRIGGERING_ACTOR": triggering_actor,
        "GITHUB_RUN_ID": "777",
        "GITHUB_RUN_ATTEMPT": "1",
        "GITHUB_WORKSPACE": str(workspace),
        "GITHUB_STEP_SUMMARY": str(summary),
        "RUNNER_TEMP": str(temp),
        "RUNNER_OS": "Linux",
        "RUNNER_ARCH": "X64",
        **({"DOCKER_HOST": os.environ["DOCKER_HOST"]} if "DOCKER_HOST" in os.environ else {}),
    }
