"""The gold replay's turns on a real patch (real ``git apply``): a change repeated in two functions
is made with the editor, each replacement widened until its text is unique in the file."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from clover_agent.eval.scripts import gold_turns
from tests.eval.tasks_fixture import diff

FUNCTION = """def {0}(iterable, maxsplit=-1):
    # Split.
    #
    # At most *maxsplit* splits.
    if maxsplit == 0:
        yield list(iterable)
        return

    buf = []
    for item in iterable:
        buf.append(item)
    yield buf
"""
OLD = "\n\n".join(FUNCTION.format(name) for name in ("split_before", "split_after", "split_when"))
NEW = OLD.replace(
    "        yield list(iterable)\n", "        buf = list(iterable)\n        if buf:\n            yield buf\n"
)
PARAM = re.compile(r"<parameter=(\w+)>\n(.*?)\n</parameter>", re.S)


def test_a_change_repeated_in_three_functions_is_three_unique_replacements(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "more.py").write_text(OLD)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    patch = diff("more.py", OLD, NEW)
    assert len(re.findall(r"^@@", patch, re.M)) == 3  # three hunks with the same text
    turns = gold_turns(repo, patch, "tests")
    calls = [(re.search(r"<function=(\w+)>", t).group(1), dict(PARAM.findall(t))) for t in turns]  # type: ignore[union-attr]
    assert [name for name, _ in calls] == ["editor"] * 4 + ["run_tests", "finish"]  # view, 3 replacements
    text = OLD
    for _, args in calls[1:4]:
        assert args["command"] == "str_replace" and text.count(args["old_str"]) == 1
        text = text.replace(args["old_str"], args["new_str"])
    assert text == NEW
