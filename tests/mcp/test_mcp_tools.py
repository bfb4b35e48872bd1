"""MCP servers' tools in a real ``fix`` run: servers written here with the ``mcp`` SDK, started over
stdio by the run (in the local sandbox's copy), their tools offered as ``mcp__<server>__<tool>``,
called through the policy, a crashing server's tools withdrawn while the run goes on, a server that
cannot start named once. The repository's own servers count only once it is trusted.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clover_agent.cli import main
from clover_agent.errors import ExitCode
from clover_agent.fix.runs import SUMMARY_FILE
from tests.clover_agent.fix.test_fix import calculator_repo, run_dirs
from tests.clover_agent.fix.test_handback_attacks import FINISH, FIX_ADD
from tests.clover_agent.test_agent_loop import call, write_replay
from tests.git_repos import git

pytestmark = pytest.mark.slow

#: Two tools and a way to die; ``where`` says the folder the server runs in (the workspace copy).
SERVER = '''
import os
from mcp.server.mcpserver import MCPServer

app = MCPServer("calc")


@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@app.tool()
def where() -> str:
    """The server's working folder."""
    return os.getcwd()


@app.tool()
def crash() -> str:
    """End the server at once."""
    os._exit(3)


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 1:  # a port: Streamable HTTP
        app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
    else:
        app.run()
'''


#: A server with the standard library only (the sandbox image has no ``mcp`` package): it writes a
#: file in its working folder and says who and where it is.
TINY_SERVER = """
import json, os, sys

TOOLS = [
    {"name": "note", "description": "Write a note file in the working folder.",
     "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}},
    {"name": "whoami", "description": "Who and where the server runs.",
     "inputSchema": {"type": "object", "properties": {}}},
]


def answer(request, result):
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}) + "\\n")
    sys.stdout.flush()


for line in sys.stdin:
    request = json.loads(line)
    method = request.get("method")
    if "id" not in request:
        continue
    if method == "initialize":
        answer(request, {"protocolVersion": request["params"]["protocolVersion"], "capabilities": {"tools": {}},
                         "serverInfo": {"name": "tiny", "version": "1"}})
    elif method == "tools/list":
        answer(request, {"tools": TOOLS})
    elif method == "tools/call":
        name, args = request["params"]["name"], request["params"].get("arguments") or {}
        if name == "note":
            with open("note.txt", "w") as f:
                f.write(args["text"])
            text = "written"
        else:
            text = f"uid={os.getuid()} cwd={os.getcwd()}"
        answer(request, {"content": [{"type": "text", "text": text}], "isError": False})
    else:
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32601, "message": "no such method"}}) + "\\n")
        sys.stdout.flush()
"""


def events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "trajectory.jsonl").read_text().splitlines()]


def finished_calls(run: Path) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for event in events(run):
        if event["type"] == "tool_call_finished":
            found.setdefault(event["name"], []).append(event)
    return found


def settings_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text(text)
    monkeypatch.setenv("CLOVER_CONFIG", str(config))
    monkeypatch.setenv("CLOVER_STATE", str(tmp_path / "state"))


def fix(repo: Path, tmp_path: Path, turns: list[str], *options: str, sandbox: str = "local") -> int:
    """``clover-agent fix test_add`` on ``turns`` (``--yes`` unless ``options`` say ``--dry-run``)."""
    replay = write_replay(tmp_path / f"replay-{len(list(tmp_path.iterdir()))}.jsonl", turns)
    return main(["fix", "test_add", "--repo", str(repo), "--backend", "replay", "--replay", str(replay),
                 "--sandbox", sandbox, *(options or ["--yes"])])  # fmt: skip


def test_a_servers_tools_are_offered_called_and_withdrawn_when_it_dies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    server = tmp_path / "calc_server.py"
    server.write_text(SERVER)
    settings_file(
        tmp_path,
        monkeypatch,
        f"""
[mcp_servers.calc]
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(server))}]
approve = "allow"

[mcp_servers.asked]
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(server))}]

[mcp_servers.broken]
command = "/nonexistent/mcp-server"
""",
    )
    repo = calculator_repo(tmp_path)
    turns = [
        call("mcp__calc__add", a=2, b=3),
        call("mcp__calc__where"),
        call("mcp__asked__add", a=1, b=1),  # "ask", and no one can be asked here: denied
        call("mcp__calc__crash"),
        call("mcp__calc__add", a=2, b=3),  # withdrawn with its server
        FIX_ADD,
        FINISH,
    ]
    code = fix(repo, tmp_path, turns)
    err = capsys.readouterr().err
    assert code == ExitCode.OK, err
    (run,) = run_dirs(repo)
    started = next(e for e in events(run) if e["type"] == "run_started")
    offered = [spec["function"]["name"] for spec in started["tools"]]
    assert {"mcp__calc__add", "mcp__calc__where", "mcp__calc__crash", "mcp__asked__add"} <= set(offered)
    assert not [name for name in offered if name.startswith("mcp__broken__")]
    calls = finished_calls(run)
    (first,) = calls["mcp__calc__add"]  # the second call is refused before it runs (below)
    assert first["output"] == "5" and not first["is_error"]
    # the server ran in the sandbox's copy of the repository, not in the repository
    (where,) = calls["mcp__calc__where"]
    assert Path(where["output"]) != repo and Path(where["output"]).name == "workspace", where["output"]
    (asked,) = calls["mcp__asked__add"]
    assert asked["is_error"] and "ask" in asked["output"].lower(), asked["output"]
    (crash,) = calls["mcp__calc__crash"]
    assert crash["is_error"] and "stopped" in crash["output"] and "mcp__calc__add" in crash["output"]
    # no longer offered: the parser refuses the call, naming what is left
    refused = [e["message"] for e in events(run) if e["type"] == "error" and "mcp__calc__add" in e["message"]]
    assert len(refused) == 1 and "there is no tool named `mcp__calc__add`" in refused[0], refused
    assert "mcp__asked__add" in refused[0] and "mcp__calc__where" not in refused[0]
    # the broken server is named once, and the run went on to the fix
    reported = [e for e in events(run) if e["type"] == "error" and e["kind"] == "mcp"]
    assert len(reported) == 1 and "broken" in reported[0]["message"], reported
    assert "did not start" in reported[0]["message"]
    assert json.loads((run / SUMMARY_FILE).read_text())["verdict"] == "fixed"
    assert "return a + b" in (repo / "calculator.py").read_text()


def test_a_repositorys_servers_start_only_once_it_is_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """A repository's ``[mcp_servers.NAME]`` runs a program: ignored (and said so) until trusted."""
    settings_file(tmp_path, monkeypatch, "")
    repo = calculator_repo(tmp_path)
    (repo / "calc_server.py").write_text(SERVER)
    (repo / ".clover").mkdir(exist_ok=True)
    (repo / ".clover" / "config.toml").write_text(
        f'[mcp_servers.theirs]\ncommand = {json.dumps(sys.executable)}\nargs = ["calc_server.py"]\napprove = "allow"\n'
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a server of the repository's")
    turns = [call("mcp__theirs__add", a=2, b=3), FIX_ADD, FINISH]
    code = fix(repo, tmp_path, turns)
    err = capsys.readouterr().err
    assert code == ExitCode.OK, err
    assert "mcp_servers ignored: you have not trusted this file" in err, err
    (run,) = run_dirs(repo)
    assert "mcp__theirs__add" not in finished_calls(run)  # not offered: the parser refused the call
    assert any("there is no tool named `mcp__theirs__add`" in e.get("message", "") for e in events(run))

    git(repo, "checkout", "-q", "calculator.py")
    code = fix(repo, tmp_path, turns, "--trust-repo", "--yes")
    assert code == ExitCode.OK, capsys.readouterr().err
    run = run_dirs(repo)[-1]
    (answered,) = finished_calls(run)["mcp__theirs__add"]
    assert answered["output"] == "5" and not answered["is_error"]


def test_bad_server_settings_are_refused_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    settings_file(tmp_path, monkeypatch, '[mcp_servers.x]\ncommand = "a"\nurl = "http://b"\n')
    repo = calculator_repo(tmp_path)
    code = fix(repo, tmp_path, [FINISH])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE and "config.toml: [mcp_servers.x]: give either command" in err, err


@pytest.mark.docker
def test_a_stdio_server_runs_inside_the_docker_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The default place of a stdio server is the sandbox: in the container, as its user, in the
    workspace; what it writes is part of the patch (seen and verified), not of the repository."""
    settings_file(
        tmp_path,
        monkeypatch,
        '[mcp_servers.tiny]\ncommand = "python3"\nargs = ["tiny_server.py"]\napprove = "allow"\n',
    )
    repo = calculator_repo(tmp_path)
    (repo / "tiny_server.py").write_text(TINY_SERVER)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a server")
    turns = [call("mcp__tiny__whoami"), call("mcp__tiny__note", text="from the server"), FIX_ADD, FINISH]
    code = fix(repo, tmp_path, turns, "--dry-run", sandbox="docker")
    err = capsys.readouterr().err
    assert code == ExitCode.OK, err
    (run,) = run_dirs(repo)
    calls = finished_calls(run)
    (who,) = calls["mcp__tiny__whoami"]
    assert who["output"] == "uid=1000 cwd=/workspace", who["output"]  # the sandbox's user, not this one
    (note,) = calls["mcp__tiny__note"]
    assert note["output"] == "written" and not note["is_error"]
    assert not (repo / "note.txt").exists()
    patch = (run / "patch.diff").read_text()
    assert "+++ b/note.txt" in patch and "+from the server" in patch, patch


def test_an_http_server_is_reached_from_this_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    server = tmp_path / "calc_server.py"
    server.write_text(SERVER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(server), str(port)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        settings_file(
            tmp_path,
            monkeypatch,
            f'[mcp_servers.web]\nurl = "http://127.0.0.1:{port}/mcp"\napprove = "allow"\n',
        )
        repo = calculator_repo(tmp_path)
        code = fix(repo, tmp_path, [call("mcp__web__add", a=20, b=22), FIX_ADD, FINISH])
        assert code == ExitCode.OK, capsys.readouterr().err
        (run,) = run_dirs(repo)
        (answer,) = finished_calls(run)["mcp__web__add"]
        assert answer["output"] == "42" and not answer["is_error"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
