"""run_tests targets can never become options of a test runner: the checks, the command lines each
framework gets, and real pytest runs in every sandbox kind (a read-only policy relies on this)."""

from __future__ import annotations

import pytest

from clover_agent.sandboxes.base import Sandbox
from clover_agent.tools.base import ToolContext, ToolError
from clover_agent.tools.registry import execute
from clover_agent.tools.run_tests import (
    Target,
    cargo_command,
    go_command,
    npm_command,
    parse_target,
    pytest_args,
    unittest_target,
)

OPTION_SHAPED = [
    ("--junitxml=/workspace/victim.py", "looks like a command-line option"),
    ("tests/test_t.py --junitxml=/workspace/victim.py", "`--junitxml=/workspace/victim.py` looks like"),
    ("-p evil_plugin", "`-p` looks like a command-line option"),
    ("-x", "`-x` looks like a command-line option"),
    ("@args.txt", "starts with `@`"),
    ("-k -x", "starts with `-`, so a test runner would read it as an option"),
    ("-k", "needs an expression"),
    ("/etc/passwd", "outside the workspace"),
    ("tests/../../etc", "climbs out of the workspace"),
    ("tests/ok.py ../x.py", "climbs out of the workspace"),
]


@pytest.mark.parametrize("target,message", OPTION_SHAPED)
def test_option_shaped_targets_are_refused(target: str, message: str) -> None:
    with pytest.raises(ToolError, match=message.replace("(", r"\(").replace("[", r"\[")):
        parse_target(target)


def test_accepted_targets() -> None:
    assert parse_target(None) is None and parse_target("  ") is None and parse_target("/workspace") is None
    assert parse_target("-k not slow") == Target(expression="not slow")
    assert parse_target("/workspace/tests/a.py::T::t b.py") == Target(words=("tests/a.py::T::t", "b.py"))


def test_each_framework_gets_its_targets_as_operands() -> None:
    two = Target(words=("tests/a.py::t", "b.py"))
    assert pytest_args(two, existing=False) == ["--", "tests/a.py::t", "b.py"]
    assert pytest_args(Target(words=("name",)), existing=True) == ["--", "name"]
    assert pytest_args(Target(words=("name",)), existing=False) == ["-k", "name"]
    assert pytest_args(Target(expression="a or b"), existing=False) == ["-k", "a or b"]
    assert unittest_target(two) == ["-v", "--", "tests.a.t", "b"]
    assert unittest_target(Target(expression="x")) == ["discover", "-v", "-k", "x"]
    assert go_command(Target(words=("./pkg/...", "TestX"))) == [
        "go",
        "test",
        "-json",
        "-run=TestX",
        "./pkg/...",
    ]
    assert go_command(Target(expression="Test(A|B)")) == ["go", "test", "-json", "-run=Test(A|B)", "./..."]
    assert cargo_command(Target(words=("tests::a", "tests::b"))) == [
        "cargo",
        "test",
        "--offline",
        "--",
        "tests::a",
        "tests::b",
    ]
    assert cargo_command(Target(expression="tests::a")) == ["cargo", "test", "--offline", "tests::a"]
    assert npm_command(Target(words=("test/a.test.js",))) == [
        "npm",
        "test",
        "--silent",
        "--",
        "test/a.test.js",
    ]
    with pytest.raises(ToolError, match="no `-k` filter"):
        npm_command(Target(expression="adds"))


@pytest.mark.asyncio(loop_scope="module")
async def test_an_option_shaped_target_changes_nothing_in_the_sandbox(sandbox: Sandbox) -> None:
    await sandbox.write_file("/workspace/tt/test_t.py", b"def test_ok():\n    assert True\n")
    await sandbox.write_file("/workspace/victim.py", b"precious = True\n")
    ctx = ToolContext(sandbox)
    for target, message in OPTION_SHAPED[:6]:
        result = await execute("run_tests", {"target": target.replace("tests/", "tt/")}, ctx)
        assert not result.ok and message.replace("tests/", "tt/") in result.output, result.output
    assert await sandbox.read_file("/workspace/victim.py") == b"precious = True\n"
    ran = await execute("run_tests", {"target": "/workspace/tt/test_t.py"}, ctx)
    assert ran.ok and ran.data["report"]["command"] == "python -m pytest -- tt/test_t.py"
    assert ran.data["report"]["passed"] == 1
    await sandbox.exec("rm -rf tt victim.py")
