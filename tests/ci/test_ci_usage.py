"""``clover-agent ci``'s checks before anything runs: each is exit 2 with one clear message, the
working tree untouched, and (once the output folder is the bot's) result.json and a ``finished``
event saying so. None of these needs Docker: they stop before a sandbox is made."""

from __future__ import annotations

import jsonschema
import pytest

from clover_agent.ci.events import events_validator
from clover_agent.ci.result import model_of
from clover_agent.ci.safety import SANDBOX_VARIABLES, sandbox_environment, stored_credentials
from tests.ci.ci_runs import run_ci
from tests.cli_process import run_cli
from tests.clover_agent.fix.test_fix import REPLAY, calculator_repo
from tests.git_repos import STORED_SECRETS, git, store_credentials

REPLAYED = ("--backend", "replay", "--replay", str(REPLAY))


def test_a_missing_task_is_a_usage_error(tmp_path) -> None:
    """argparse's errors end as every run does: the usage on stderr, result.json and summary.md in
    the output folder, the ``finished`` line last on stdout (checked by run_ci), exit 2."""
    repo = calculator_repo(tmp_path)
    run = run_ci(repo, tmp_path / "out", *REPLAYED)
    assert run.code == 2
    assert run.stderr.startswith("usage: clover-agent ci ")
    assert "one of the arguments --task --task-file is required" in run.stderr
    assert run.result["status"] == "usage_error" and "one of the arguments --task" in run.result["message"]
    assert [e["type"] for e in run.events] == ["finished"]
    assert "NOT RUN: usage or configuration error" in run.summary
    both = run_ci(repo, tmp_path / "o", "--task", "x", "--task-file", "f")
    assert both.code == 2 and "not allowed with argument" in both.stderr
    assert both.result["task"]["source"] == "--task"


@pytest.mark.parametrize(
    "args",
    [
        ("--task", "fix add", "--max-steps", "many"),
        ("--task", "fix add", "--backend", "nope"),
        ("--task", "fix add", "--no-such-option"),
        ("--task", "fix add", "--max-time"),  # the last option's value missing
    ],
)
def test_every_bad_argument_ends_with_result_json_and_finished(tmp_path, args) -> None:
    repo = calculator_repo(tmp_path)
    run = run_ci(repo, tmp_path / "out", *args)
    assert run.code == 2 and "usage: clover-agent ci " in run.stderr
    assert run.result["status"] == "usage_error" and run.result["message"].startswith("bad arguments: ")
    assert run.events[-1]["message"] == run.result["message"]


def test_the_finished_line_is_checked_against_the_result_schema(tmp_path) -> None:
    """``finished.result`` refers to result.schema.json: a line whose result lacks a field the
    result needs, or has a status it does not know, is not a valid line."""
    run = run_ci(calculator_repo(tmp_path), tmp_path / "out", "--max-steps", "x")
    validator = events_validator()
    finished = run.events[-1]
    validator.validate(finished)
    for broken in ({k: v for k, v in finished["result"].items() if k != "patch"},
                   {**finished["result"], "status": "fine"}):  # fmt: skip
        with pytest.raises(jsonschema.ValidationError):
            validator.validate({**finished, "result": broken})


def test_bad_arguments_write_nothing_in_a_folder_that_is_not_the_bots(tmp_path) -> None:
    """--output-dir inside the work tree and not ignored: the same refusal as a run's, and still
    the finished line, which says why nothing was written."""
    repo = calculator_repo(tmp_path)
    run = run_ci(repo, repo / "out", "--max-steps", "x")
    assert run.code == 2 and not (repo / "out").exists() and run.result is None
    assert "nothing written to --output-dir" in run.events[-1]["message"]
    assert "not ignored by git" in run.events[-1]["message"]
    # Without --repo, the work tree the folder lies in is the one checked.
    proc = run_cli("ci", "--task", "x", "--output-dir", str(repo / "out2"), "--json-events")
    assert proc.returncode == 2 and not (repo / "out2").exists()
    assert '"type": "finished"' in proc.stdout.splitlines()[-1]


def test_a_task_of_hidden_text_only_is_empty(tmp_path) -> None:
    repo = calculator_repo(tmp_path)
    run = run_ci(repo, tmp_path / "out", "--task", "<!-- fix it -->\u200b", *REPLAYED)
    assert run.code == 2
    assert "the task (--task) is empty once hidden text is removed" in run.stderr
    assert run.result["task"]["removed"] == {"html_comments": 1, "invisible_characters": 1}
    assert run.result["agent"] is None and run.result["outputs"]["trajectory"] is None
    assert run.result["starting_commit"] == git(repo, "rev-parse", "HEAD").strip()
    assert "NOT RUN: usage or configuration error" in run.summary


@pytest.mark.parametrize(
    ("key", "value", "shown"),
    [
        ("http.https://github.com/.extraheader", "AUTHORIZATION: basic c2VjcmV0LXRva2Vu", "extraheader"),
        ("remote.origin.url", "https://x-access-token:ghs_secret123@github.com/o/r.git", "remote.origin.url"),
        ("credential.helper", "store --file=.git/creds", "credential.helper"),
    ],
)
def test_stored_git_credentials_are_refused(tmp_path, key: str, value: str, shown: str) -> None:
    repo = calculator_repo(tmp_path)
    git(repo, "config", key, value)
    run = run_ci(repo, tmp_path / "out", "--task", "fix add", *REPLAYED)
    assert run.code == 2
    assert (
        "holds credentials" in run.stderr
        and shown in run.stderr
        and "persist-credentials: false" in run.stderr
    )
    secret = value.split(":")[-1].split("@")[0] if "@" in value else value.split()[-1]
    assert secret not in run.outputs_text()


def test_every_stored_credential_shape_is_refused_and_named(tmp_path) -> None:
    """The bot and the sandbox share the shapes (clover_agent.sandboxes.git_config): each one in
    .git/config, config.worktree and a submodule's git folder stops the run, named, never shown."""
    repo = calculator_repo(tmp_path)
    store_credentials(repo, tmp_path / "secret.inc")
    modules = repo / ".git" / "modules" / "lib"
    git(tmp_path, "init", "-q", "--bare", str(modules))
    git(modules, "config", "http.https://github.com/.extraheader", "AUTHORIZATION: bearer SECRET_MODULE")
    run = run_ci(repo, tmp_path / "out", "--task", "fix add", *REPLAYED)
    assert run.code == 2 and "holds credentials" in run.stderr
    for key in ("http.extraheader", "http.https://github.com/.extraheader", "remote.origin.url",
                "remote.origin.pushurl", "credential.helper", "credential.username", "include.path",
                "includeif.gitdir:/.path", "url.https://github.com/.insteadof", "http.cookiefile",
                "http.proxy", "core.sshcommand", "core.askpass", "config.worktree: http.extraheader",
                "modules/lib/config: http.https://github.com/.extraheader"):  # fmt: skip
        assert key in run.stderr
    assert not [s for s in (*STORED_SECRETS, "SECRET_MODULE") if s in run.outputs_text()]


def test_harmless_git_configuration_is_not_a_credential(tmp_path) -> None:
    repo = calculator_repo(tmp_path)
    git(repo, "config", "remote.origin.url", "https://github.com/o/r.git")
    git(repo, "config", "credential.helper", "")  # turning helpers off
    git(repo, "config", "url.git@github.com:.insteadOf", "https://github.com/")
    assert stored_credentials(repo) == []


def test_the_bot_works_on_a_clean_commit(tmp_path) -> None:
    repo = calculator_repo(tmp_path)
    (repo / "calculator.py").write_text("# edited\n")
    run = run_ci(repo, tmp_path / "out", "--task", "fix add", *REPLAYED)
    assert run.code == 2 and "has uncommitted changes or untracked files (M calculator.py)" in run.stderr
    git(repo, "checkout", "calculator.py")
    (repo / "notes.txt").write_text("untracked\n")
    run = run_ci(repo, tmp_path / "out", "--task", "fix add", *REPLAYED)
    assert run.code == 2 and "?? notes.txt" in run.stderr


def test_the_output_folder_must_be_the_bots_own(tmp_path) -> None:
    repo = calculator_repo(tmp_path)
    run = run_ci(repo, repo / "out", "--task", "fix add", *REPLAYED)  # inside the tree, not ignored
    assert run.code == 2 and "is inside the repository and not ignored by git" in run.stderr
    assert not (repo / "out").exists()
    assert [e["type"] for e in run.events] == ["finished"] and run.events[0]["result"][
        "status"
    ] == "usage_error"

    full = tmp_path / "full"
    full.mkdir()
    (full / "mine.txt").write_text("keep me\n")
    run = run_ci(repo, full, "--task", "fix add", *REPLAYED)
    assert run.code == 2 and "is not empty (mine.txt)" in run.stderr
    assert (full / "mine.txt").read_text() == "keep me\n" and not (full / "result.json").exists()

    run = run_ci(repo, tmp_path / "out", "--task", "fix add", "--target=--junitxml=/workspace/x", *REPLAYED)
    assert run.code == 2 and "looks like an option" in run.stderr
    assert run.result["status"] == "usage_error"
    # The same folder again: the previous run's files are replaced by this one's.
    run = run_ci(repo, tmp_path / "out", "--task", "fix add", "--target=-k add", "--backend", "replay")
    assert run.code == 2 and "--backend replay needs --replay FILE" in run.stderr


def test_an_ignored_output_folder_inside_the_repository_is_fine(tmp_path) -> None:
    repo = calculator_repo(tmp_path)
    (repo / ".gitignore").write_text("/out/\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-qm", "ignore out")
    run = run_ci(repo, repo / "out", "--task", "<!-- -->", *REPLAYED)
    assert run.code == 2 and "empty once hidden text is removed" in run.stderr
    assert (repo / "out" / "result.json").exists()


def test_a_task_file_that_cannot_be_read(tmp_path) -> None:
    repo = calculator_repo(tmp_path)
    run = run_ci(repo, tmp_path / "out", "--task-file", str(tmp_path / "nope.md"), *REPLAYED)
    assert run.code == 2 and f"--task-file {tmp_path / 'nope.md'}: No such file or directory" in run.stderr
    assert run.result["task"]["source"] == f"--task-file {tmp_path / 'nope.md'}"


def test_in_github_actions_the_log_is_inside_stop_commands(tmp_path) -> None:
    """GITHUB_ACTIONS=true: the human log (stderr with --json-events) starts with
    ``::stop-commands::TOKEN`` and ends with ``::TOKEN::``, a new random token each run, so the
    runner obeys no workflow command in it; elsewhere neither line is written."""
    repo = calculator_repo(tmp_path)
    tokens = []
    for n in range(2):
        for json_events in (True, False):
            run = run_ci(repo, tmp_path / f"out{n}{json_events}", "--task", "<!-- -->", *REPLAYED,
                         env={"GITHUB_ACTIONS": "true"}, json_events=json_events)  # fmt: skip
            log = (run.stderr if json_events else run.stdout).splitlines()
            assert run.code == 2 and log[0].startswith("::stop-commands::")
            token = log[0].removeprefix("::stop-commands::")
            assert len(token) >= 32 and log[-1] == f"::{token}::"
            assert "NOT RUN" in "\n".join(log[1:-1])
            tokens.append(token)
    assert len(set(tokens)) == len(tokens)
    bad = run_ci(repo, tmp_path / "bad", "--max-steps", "x", env={"GITHUB_ACTIONS": "true"})
    assert "::stop-commands::" in bad.stderr and bad.stderr.rstrip().endswith("::")
    plain = run_ci(repo, tmp_path / "plain", "--task", "<!-- -->", *REPLAYED, env={"GITHUB_ACTIONS": ""})
    assert "stop-commands" not in plain.stderr


def test_only_the_allow_listed_variables_go_into_the_sandbox() -> None:
    host = {
        "CI": "true",
        "TZ": "UTC",
        "GITHUB_TOKEN": "ghp_x",
        "CLOVER_API_KEY": "sk",
        "PATH": "/bin",
        "LANG": "",
    }
    assert sandbox_environment(host) == {"CI": "true", "TZ": "UTC"}
    assert not any(word in name for name in SANDBOX_VARIABLES for word in ("KEY", "TOKEN", "SECRET", "PASS"))


def test_the_model_named_by_a_backend() -> None:
    assert model_of("engine:Clover-35B-A3B@cuda") == "Clover-35B-A3B"
    assert model_of("openai:clover@gpu-host:30000") == "clover"
    assert model_of("replay:turns.jsonl") is None and model_of(None) is None
