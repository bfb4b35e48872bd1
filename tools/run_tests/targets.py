"""What ``run_tests`` accepts as a target, checked before any framework sees it.

A target is ``-k EXPRESSION`` (a name filter: pytest's and unittest's ``-k``, ``go test -run``,
cargo's test-name filter) or node ids, files and directories separated by spaces. It can never
become an option of the framework, even under a read-only policy where ``run_tests`` is the one
way to run code: a word starting with ``-`` (other than the leading ``-k``) is refused, and so is
one starting with ``@`` (argparse-based runners, pytest >= 8.2 among them, read more arguments
from the file it names); pytest and unittest get the words after ``--`` as well. Paths stay
inside the workspace: absolute ones must be under ``/workspace`` (they are made relative), and
none may climb out through ``..``.
"""

from __future__ import annotations

from dataclasses import dataclass

from clover_agent.sandboxes.base import WORKSPACE
from clover_agent.tools.base import ToolError

FORMS = "a node id (`tests/test_x.py::test_y`), a file or directory, or `-k EXPRESSION`"


@dataclass(frozen=True)
class Target:
    """A checked target: a ``-k`` expression, or workspace-relative words (node ids, paths)."""

    expression: str | None = None
    words: tuple[str, ...] = ()


def parse_target(target: str | None) -> Target | None:
    """The checked form of ``target`` (None: run everything), or :class:`ToolError` saying why not."""
    text = (target or "").strip()
    if not text:
        return None
    if text == "-k" or text.startswith(("-k ", "-k\t")):
        expression = text[2:].strip()
        if not expression:
            raise ToolError("The target `-k` needs an expression after it, e.g. `-k test_add`.")
        if expression.startswith("-"):
            raise ToolError(
                f"The `-k` expression `{expression}` starts with `-`, so a test runner would read it as an "
                "option; give a test name or an expression such as `not slow`."
            )
        return Target(expression=expression)
    words = []
    for word in text.split():
        if word.startswith("-"):
            raise ToolError(
                f"The target word `{word}` looks like a command-line option, which run_tests never passes on. "
                f"Give {FORMS}; to run the tests with options, use the shell tool."
            )
        if word.startswith("@"):
            raise ToolError(
                f"The target word `{word}` starts with `@`, which test runners read as a file of more "
                f"arguments. Give {FORMS}."
            )
        if word.startswith("/"):
            if not (word == WORKSPACE or word.startswith(WORKSPACE + "/")):
                raise ToolError(
                    f"The target {word} is outside the workspace; give a path inside {WORKSPACE}."
                )
            word = word[len(WORKSPACE) + 1 :]
        if ".." in word.split("::")[0].split("/"):
            raise ToolError(f"The target {word} climbs out of the workspace through `..`.")
        if word:
            words.append(word)
    return Target(words=tuple(words)) if words else None
