"""``clover-agent ci`` with a hostile agent (replayed turns, not a model; Docker, pytest and git
real): what it prints goes into a CI log, where GitHub Actions obeys workflow commands, and
``summary.md`` becomes a pull request's body."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from tests.ci.ci_runs import run_ci
from tests.clover_agent.fix.test_fix import calculator_repo
from tests.clover_agent.fix.test_handback_attacks import HOSTILE_TURNS, command_lines, raw_controls
from tests.clover_agent.test_agent_loop import call, write_replay

pytestmark = [pytest.mark.slow, pytest.mark.docker]

#: A file whose name is HTML and a Markdown link and image, with a backtick to end a code span.
HTML_NAME = "x<img src=y onerror=alert(1)>`](http:evil)![i](http:img).py"
HTML_SUMMARY = (
    "Fixed add.\n```\n<img src=x onerror=alert(1)> [click](https://evil.example) ![i](https://evil.example/i.png)"
    "\n<script>alert(1)</script>\n````\n::add-mask::secret\n##[error]old\n\x1b]0;pwned\x07\u202eevil\n"
)
#: The tags a CommonMark renderer makes of summary.md's own Markdown (headings, paragraphs, code,
#: bold, the tests table).
OWN_TAGS = {"h3", "p", "pre", "code", "strong", "table", "thead", "tbody", "tr", "th", "td", "br", "ul", "li"}


def test_the_log_and_summary_md_obey_nothing_the_agent_wrote(tmp_path: Path) -> None:
    """Tries: the model's text, a command's output and the finish summary hold escape sequences,
    bidi controls and workflow commands (``::add-mask::``, ``::error::``, ``::stop-commands::``,
    ``##[error]``); the summary also tries to close its code fence and bring HTML, a link and an
    image into summary.md, and the created files are named with backspaces and escapes, and with
    HTML, a Markdown link and a backtick. Held: the human log (stderr) has no raw control and no
    line a runner takes for a workflow command; the JSON Lines events on stdout have none either
    (the same texts, written as JSON escapes); summary.md has no raw control, and rendered as
    CommonMark it holds only its own tags: the agent's HTML, link and image are text, inside code."""
    repo = calculator_repo(tmp_path)
    turns = [
        *HOSTILE_TURNS[:-1],
        call("shell", command=f"echo 'HTML = 1' > '{HTML_NAME}'"),
        call("finish", summary=HTML_SUMMARY),
    ]
    replay = write_replay(tmp_path / "hostile.jsonl", turns)
    run = run_ci(repo, tmp_path / "out", "--task", "Adding numbers is wrong", "--target",
                 "tests/test_calculator.py::test_add", "--backend", "replay", "--replay", str(replay),
                 env={"GITHUB_ACTIONS": "true"})  # fmt: skip
    assert run.code == 0, run.stderr
    assert HTML_NAME in run.result["files_changed"] and run.result["agent"]["summary"] == HTML_SUMMARY

    # In GitHub Actions the whole human log is between ::stop-commands:: and its token's end: the
    # runner obeys nothing in it, however a line is wrapped. The token is nowhere the model could
    # have seen it (the trajectory holds all it read).
    first, *inside, last = run.stderr.splitlines()
    token = first.removeprefix("::stop-commands::")
    assert first.startswith("::stop-commands::") and len(token) >= 32 and last == f"::{token}::"
    assert token not in (run.out / "trajectory.jsonl").read_text() and token not in run.stdout
    log = "\n".join(inside)  # the human log, as a CI job shows it
    assert raw_controls(log) == set() and command_lines(log) == []
    assert r"\::add-mask::hidden" in log and r"\x1b]0;pwned\x07" in log and r"\u202eevil" in log

    assert raw_controls(run.stdout) == set() and command_lines(run.stdout) == []
    outputs = [e["output"] for e in run.events if e["type"] == "tool_result"]
    assert any("\x1b]0;pwned\x07\x1b]52;c;ZXZpbA==\x07" in o for o in outputs)  # decoded: the same text
    assert run.events[-1]["result"]["agent"]["summary"] == HTML_SUMMARY

    summary = run.summary
    assert raw_controls(summary) == set()
    assert r"\::add-mask::secret" in summary and r"#\#[error]old" in summary
    html = MarkdownIt("commonmark").enable("table").render(summary)
    tags = {name.lower() for name in re.findall(r"</?([a-zA-Z][a-zA-Z0-9]*)", html)}
    assert tags <= OWN_TAGS, tags
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and "&lt;script&gt;" in html
    assert "&lt;img src=y onerror=alert(1)&gt;" in html  # the file's name, shown in a code span
    assert r"odd\x08\x08\x08\x1b[8m\u202ename.py" in summary
