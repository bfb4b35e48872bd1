"""``clover-agent run "INSTRUCTION"``: one-shot and headless, for harnesses (docs/run.md).

Each test replays an agent (recorded turns, not a model); the rest is real: the local sandbox, the
in-place runner, Docker, git repositories, the host's stock of the folder and the apply.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clover_agent.cli import main
from clover_agent.errors import ExitCode
from tests.cli_process import start_signalable
from tests.clover_agent.test_agent_loop import call, write_replay
from tests.clover_agent.test_backend_openai import ChatServer, _chunk
from tests.git_repos import git, make_repo

EDIT = call(
    "shell",
    command="echo world >> /workspace/a.txt && mkdir -p /workspace/sub && echo new > /workspace/sub/b.txt",
)
FINISH = call("finish", summary="Appended world and added sub/b.txt.")
RESULT_FIELDS = {"outcome", "exit_code", "message", "verdict", "claim", "summary", "steps", "tokens",
                 "elapsed_s", "files", "left_out", "applied", "patch", "trajectory"}  # fmt: skip


def run(
    tmp_path: Path, capsys, folder: Path, turns: list[str], *options: str, default_out: bool = False
) -> tuple[int, str, str, Path]:
    """``clover-agent run`` on ``folder`` with ``turns`` replayed: (exit code, stdout, stderr, the
    output folder). Output goes to a fresh folder outside ``folder`` unless ``options`` name one or
    ``default_out`` (no ``--out``)."""
    replay = write_replay(tmp_path / f"replay-{len(list(tmp_path.glob('replay-*')))}.jsonl", turns)
    out = tmp_path / f"out-{len(list(tmp_path.glob('out-*')))}"
    argv = ["run", "Append world to a.txt", "--dir", str(folder), "--replay", str(replay), *options]
    if "--out" not in options and not default_out:
        argv += ["--out", str(out)]
    code = main(argv)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return code, captured.out, captured.err, out


def plain_folder(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "a.txt").write_text("hello\n")
    return root


def git_files(repo: Path) -> dict[str, str]:
    """Every file under ``.git`` with its digest: what "nothing written into .git" compares."""
    return {
        str(p.relative_to(repo)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((repo / ".git").rglob("*"))
        if p.is_file()
    }


def result_of(out: Path) -> dict:
    return json.loads((out / "result.json").read_text())


@pytest.mark.parametrize("sandbox", ["local", "none"])
def test_a_plain_folder_gets_the_change_the_diff_and_the_result(tmp_path: Path, capsys, sandbox: str) -> None:
    folder = plain_folder(tmp_path / "app")
    code, stdout, _, out = run(tmp_path, capsys, folder, [EDIT, FINISH], "--sandbox", sandbox)

    assert code == ExitCode.OK
    assert (folder / "a.txt").read_text() == "hello\nworld\n"
    assert (folder / "sub" / "b.txt").read_text() == "new\n"
    assert sorted(p.name for p in folder.iterdir()) == [
        "a.txt",
        "sub",
    ]  # no .git made, not even for the baseline
    patch = (out / "patch.diff").read_text()
    assert "+world" in patch and "b/sub/b.txt" in patch
    result = result_of(out)
    assert set(result) >= RESULT_FIELDS
    assert result["outcome"] == "submitted" and result["exit_code"] == 0 and result["verdict"] is None
    assert result["claim"] == "Appended world and added sub/b.txt."
    assert result["files"] == ["a.txt", "sub/b.txt"] and result["applied"] is True
    assert result["steps"] == 2 and result["tokens"] > 0 and result["sandbox"] == sandbox
    assert (out / "trajectory.jsonl").is_file()
    assert not (out / "shadow.git").exists()
    (line,) = stdout.splitlines()  # one summary line on stdout
    assert line.startswith("clover-agent run: submitted (exit 0)") and "2 files changed" in line


def test_in_place_leaves_no_temporary_folder_and_reaps_a_killed_runs(tmp_path: Path, capsys) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a process that no longer exists: the owner of a killed run's folder
    stale = Path(tempfile.gettempdir()) / f"clover-agent-inplace-{gone.pid}-test"
    (stale / "tmp").mkdir(parents=True)
    folder = plain_folder(tmp_path / "app")
    code, _, _, _ = run(tmp_path, capsys, folder, [EDIT, FINISH], "--sandbox", "none")

    assert code == ExitCode.OK
    assert not stale.exists()
    # this process's own (other test workers may be running theirs beside it)
    assert not list(Path(tempfile.gettempdir()).glob(f"clover-agent-inplace-{os.getpid()}-*"))


def test_the_default_output_folder_is_in_the_folders_clover(tmp_path: Path, capsys) -> None:
    folder = plain_folder(tmp_path / "app")
    code, stdout, _, _ = run(tmp_path, capsys, folder, [EDIT, FINISH], "--sandbox", "local", default_out=True)
    assert code == ExitCode.OK
    (out,) = [p for p in (folder / ".clover" / "runs").iterdir() if p.is_dir()]
    assert result_of(out)["files"] == ["a.txt", "sub/b.txt"]  # .clover itself is never part of the change
    assert str(out) in stdout


@pytest.mark.parametrize("sandbox", ["local", "none"])
def test_nothing_is_written_into_the_folders_git(tmp_path: Path, capsys, sandbox: str) -> None:
    repo = make_repo(tmp_path / "repo", {"a.txt": "hello\n"})
    before = git_files(repo)
    turns = [EDIT, FINISH]
    if sandbox == "local":  # on a copy the agent may even try: none of it comes back
        hook = call(
            "shell", command="echo 'touch /tmp/pwned' > .git/hooks/post-checkout && echo x >> .git/config"
        )
        turns = [EDIT, hook, FINISH]
    code, _, _, out = run(tmp_path, capsys, repo, turns, "--sandbox", sandbox)

    assert code == ExitCode.OK
    assert git_files(repo) == before
    assert (repo / "a.txt").read_text() == "hello\nworld\n"
    assert git(repo, "status", "--porcelain").splitlines() == [" M a.txt", "?? sub/"]
    assert result_of(out)["files"] == ["a.txt", "sub/b.txt"]


def test_the_agent_writing_outside_the_folder_gets_nothing_there(tmp_path: Path, capsys) -> None:
    folder = plain_folder(tmp_path / "work" / "app")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    escape = call(
        "shell",
        command=f"echo x > ../x.txt; ln -s .. up; echo y > up/y.txt; ln -s {outside} away; ln -s /etc etc; "
        "mkdir -p deep && ln -s ../.. deep/top",
    )
    code, _, _, out = run(tmp_path, capsys, folder, [EDIT, escape, FINISH], "--sandbox", "local")

    assert code == ExitCode.OK
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["app"]
    assert sorted(p.name for p in folder.iterdir()) == ["a.txt", "sub"]  # no link out was written back
    assert list(outside.iterdir()) == []
    result = result_of(out)
    assert result["files"] == ["a.txt", "sub/b.txt"]
    assert set(result["left_out"]) == {"up", "away", "etc", "deep/top"}
    assert all("outside the repository" in why for why in result["left_out"].values())


def test_a_spent_budget_says_so_and_keeps_the_change(tmp_path: Path, capsys) -> None:
    folder = plain_folder(tmp_path / "app")
    code, stdout, _, out = run(
        tmp_path, capsys, folder, [EDIT, FINISH], "--sandbox", "local", "--max-steps", "1"
    )

    assert code == ExitCode.BUDGET_EXHAUSTED
    result = result_of(out)
    assert result["exit_code"] == ExitCode.BUDGET_EXHAUSTED and result["outcome"] == "budget_exhausted"
    assert result["claim"] is None and "budget" in result["message"]
    assert result["files"] == ["a.txt", "sub/b.txt"] and result["applied"] is True
    assert (folder / "a.txt").read_text() == "hello\nworld\n"
    assert stdout.startswith("clover-agent run: budget_exhausted (exit 6)")


def test_working_in_place_must_be_asked_for_by_name(tmp_path: Path, capsys) -> None:
    folder = plain_folder(tmp_path / "app")
    replay = write_replay(tmp_path / "replay.jsonl", [EDIT, FINISH])
    for wrong in (["--in-place"], ["--sandbox", "no"], ["--sandbox", "inplace"], ["--sandbox"]):
        with pytest.raises(SystemExit) as stopped:
            main(["run", "x", "--dir", str(folder), "--replay", str(replay), *wrong])
        assert stopped.value.code == ExitCode.USAGE
    from clover_agent.cli import build_parser

    parsed = build_parser().parse_args(["run", "x"])
    assert parsed.sandbox == "docker"  # the default isolates; none is never chosen for you
    assert (folder / "a.txt").read_text() == "hello\n"


def test_an_output_folder_inside_the_folder_is_refused(tmp_path: Path, capsys) -> None:
    folder = plain_folder(tmp_path / "app")
    code, _, stderr, _ = run(
        tmp_path, capsys, folder, [EDIT, FINISH], "--sandbox", "none", "--out", str(folder / "o")
    )
    assert code == ExitCode.USAGE and "lies in --dir" in stderr
    assert sorted(p.name for p in folder.iterdir()) == ["a.txt"]


@pytest.mark.docker
@pytest.mark.slow
def test_a_repository_in_docker_gets_the_change_back_without_questions(tmp_path: Path, capsys) -> None:
    repo = make_repo(tmp_path / "repo", {"a.txt": "hello\n", "tool.sh": "#!/bin/sh\necho hi\n"})
    before = git_files(repo)
    escape = call("shell", command=f"echo x > ../x.txt; ln -s {tmp_path} away; chmod +x tool.sh")
    code, stdout, _, out = run(tmp_path, capsys, repo, [EDIT, escape, FINISH], "--sandbox", "docker")

    assert code == ExitCode.OK, stdout
    assert (repo / "a.txt").read_text() == "hello\nworld\n"
    assert (repo / "sub" / "b.txt").read_text() == "new\n"
    assert (repo / "tool.sh").stat().st_mode & 0o100  # written back without a question
    assert not (repo / "away").exists() and not (tmp_path / "x.txt").exists()
    assert git_files(repo) == before
    result = result_of(out)
    assert result["files"] == ["a.txt", "sub/b.txt", "tool.sh"] and result["applied"] is True
    assert set(result["left_out"]) == {"away"} and result["sandbox"] == "docker"


@pytest.fixture
def server() -> Iterator[ChatServer]:
    chat = ChatServer()
    yield chat
    chat.close()


def _streamed(text: str) -> dict:
    return {"sse": [_chunk({"content": text}), _chunk({}, finish="stop"), "[DONE]"]}


def _run_process(folder: Path, *args: str, env: dict[str, str]) -> subprocess.Popen:
    """``clover-agent run`` as a harness starts it in the container: its own process, in ``folder``."""
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)  # absolute: the child starts elsewhere
    python_path = os.pathsep.join(str(Path(p).resolve()) for p in paths if p)
    return start_signalable(
        [sys.executable, "-m", "clover_agent", "run", "Append world to a.txt", *args],
        cwd=folder,
        env={**os.environ, "PYTHONPATH": python_path, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_harness_command_line_against_a_server(tmp_path: Path, server: ChatServer) -> None:
    """What docs/run.md gives a harness: in the folder, in place, the model behind an
    OpenAI-compatible server, the API key from the environment (sent, never written)."""
    folder = plain_folder(tmp_path / "app")
    server.models = ["clover"]
    server.replies.extend([_streamed(EDIT), _streamed(call("shell", command="env")), _streamed(FINISH)])
    key = "sk-run-never-shown-0123456789"
    logs = tmp_path / "logs" / "agent"
    child = _run_process(
        folder, "--sandbox", "none", "--backend", "openai", "--base-url", server.base_url, "--out", str(logs),
        env={"CLOVER_API_KEY": key, "HARNESS_TASK_SETTING": "on", "CLOUD_ACCESS_TOKEN": "tok-never-shown"},
    )  # fmt: skip
    stdout, stderr = child.communicate(timeout=120)

    assert child.returncode == ExitCode.OK, stderr
    assert (folder / "a.txt").read_text() == "hello\nworld\n"
    result = result_of(logs)
    assert result["outcome"] == "submitted" and result["files"] == ["a.txt", "sub/b.txt"]
    assert stdout.count("\n") == 1 and stdout.startswith("clover-agent run: submitted (exit 0)")
    posts = [r for r in server.requests if r["body"] is not None]
    assert len(posts) == 3 and all(r["headers"]["Authorization"] == f"Bearer {key}" for r in posts)
    written = "".join(p.read_text() for p in logs.iterdir())
    assert key not in stdout + stderr + written and "tok-never-shown" not in written
    assert (
        "HARNESS_TASK_SETTING=on" in (logs / "trajectory.jsonl").read_text()
    )  # the container's own settings


def test_a_harness_timeout_sigterm_ends_as_an_interrupt_with_the_result(
    tmp_path: Path, server: ChatServer
) -> None:
    folder = plain_folder(tmp_path / "app")
    server.models = ["clover"]
    server.replies.extend([_streamed(EDIT), {"until_hung_up": 600}])
    logs = tmp_path / "logs"
    child = _run_process(
        folder, "--sandbox", "none", "--base-url", server.base_url, "--out", str(logs), env={}
    )
    deadline = time.monotonic() + 120
    while len([r for r in server.requests if r["body"] is not None]) < 2:  # waiting on the model
        assert child.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    stdout, _ = child.communicate(timeout=120)

    assert child.returncode == ExitCode.INTERRUPTED
    result = result_of(logs)
    assert result["exit_code"] == ExitCode.INTERRUPTED and result["message"] == "interrupted"
    assert (logs / "patch.diff").is_file() and (logs / "trajectory.jsonl").is_file()
    assert (folder / "a.txt").read_text() == "hello\nworld\n"  # in place: the change made so far is there
    assert stdout.startswith("clover-agent run: ")


def test_without_docker_the_message_names_the_in_place_way(tmp_path: Path, capsys) -> None:
    folder = plain_folder(tmp_path / "app")
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{port}")
        code, stdout, _, out = run(tmp_path, capsys, folder, [EDIT, FINISH])

    assert code == ExitCode.SANDBOX_UNAVAILABLE
    result = result_of(out)
    assert result["exit_code"] == 4 and result["outcome"] == "error" and result["files"] == []
    assert "--sandbox none" in result["message"] and (out / "patch.diff").read_text() == ""
    assert stdout.startswith("clover-agent run: error (exit 4)")
    assert (folder / "a.txt").read_text() == "hello\n"


def test_a_server_out_of_reach_is_3_with_the_result_written(tmp_path: Path, capsys) -> None:
    folder = plain_folder(tmp_path / "app")
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    out = tmp_path / "logs"
    code = main(["run", "x", "--dir", str(folder), "--sandbox", "none", "--base-url", f"http://127.0.0.1:{port}/v1",
                 "--out", str(out)])  # fmt: skip
    stdout = capsys.readouterr().out

    assert code == ExitCode.MODEL_UNAVAILABLE
    result = result_of(out)
    assert result["exit_code"] == 3 and f"127.0.0.1:{port}" in result["message"] and result["steps"] == 0
    assert stdout.startswith("clover-agent run: error (exit 3)") and "0 files changed;" in stdout
    assert sorted(p.name for p in folder.iterdir()) == ["a.txt"]
