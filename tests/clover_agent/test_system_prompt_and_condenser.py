"""Condensation keeps the conversation under the window, pinning the system prompt, task and recent turns."""

from __future__ import annotations

from clover_agent.agent.condenser import DROPPED_OUTPUT, Condenser
from clover_agent.agent.system_prompt import RepositoryFacts, system_prompt
from tests.sandbox_specs import sandbox_spec


def chars_as_tokens(messages: list[dict]) -> int:
    return sum(len(str(m.get("content", ""))) for m in messages)


def conversation(turns: int, output_chars: int) -> list[dict]:
    messages = [{"role": "system", "content": "S" * 100}, {"role": "user", "content": "fix test_add"}]
    for i in range(turns):
        call = {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "shell", "arguments": {"command": f"cat f{i}"}},
        }
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append(
            {"role": "tool", "tool_call_id": f"c{i}", "name": "shell", "content": str(i) * output_chars}
        )
    return messages


def test_nothing_happens_under_the_limit() -> None:
    condenser = Condenser(context_window=100_000, reply_tokens=0, threshold=1.0)
    assert condenser.condense(conversation(3, 100), chars_as_tokens) is None


def test_old_tool_outputs_go_first_and_pinned_parts_stay() -> None:
    messages = conversation(6, 1000)
    condenser = Condenser(context_window=4000, reply_tokens=0, threshold=1.0, keep_recent=4)
    result = condenser.condense(messages, chars_as_tokens)
    assert result is not None
    assert result.tokens_before > 4000 >= result.tokens_after
    new = result.messages
    assert new[:2] == messages[:2]  # system prompt and task pinned
    assert new[-5:-1] == messages[-4:]  # the recent messages untouched
    assert new[3]["content"].startswith(DROPPED_OUTPUT) and "shell command=cat f0" in new[3]["content"]
    assert len(new) == len(messages) + 1  # only outputs were replaced; no turn removed
    assert new[-1]["role"] == "user" and "shell command=cat f0" in new[-1]["content"]
    assert result.note == new[-1]["content"]
    assert "earlier tool calls were replaced" in result.note
    assert messages[3]["content"] == "0" * 1000  # the input list is not modified


def test_whole_turns_go_when_outputs_are_not_enough() -> None:
    messages = conversation(6, 10)
    messages[2]["content"] = "long reasoning " * 300  # an assistant turn that is big by itself
    condenser = Condenser(context_window=1000, reply_tokens=0, threshold=1.0, keep_recent=4)
    result = condenser.condense(messages, chars_as_tokens)
    assert result is not None and result.tokens_after <= 1000
    assert "turns were removed" in result.note
    # No tool message lost its assistant call.
    ids = {c["id"] for m in result.messages for c in m.get("tool_calls") or ()}
    assert all(m["tool_call_id"] in ids for m in result.messages if m["role"] == "tool")
    assert result.messages[:2] == messages[:2]


def test_system_prompt_names_facts_and_instruction_paths() -> None:
    facts = RepositoryFacts(
        languages=[("Python", 3), ("Markdown", 1)],
        test_command="python -m pytest",
        top_level=["src/", "tests/", "AGENTS.md"],
        instructions=[("/workspace/AGENTS.md", "Use tabs."), ("/workspace/src/CLOVER.md", "No prints.")],
    )
    prompt = system_prompt(facts)
    assert "Python 3, Markdown 1" in prompt
    assert "python -m pytest" in prompt
    assert "src/  tests/  AGENTS.md" in prompt
    assert (
        prompt.index("/workspace/AGENTS.md")
        < prompt.index("Use tabs.")
        < prompt.index("/workspace/src/CLOVER.md")
    )
    assert "applies to /workspace/src/" in prompt


async def test_facts_come_from_the_workspace_through_the_sandbox(tmp_path) -> None:
    import subprocess

    from clover_agent.agent.system_prompt import gather_facts
    from clover_agent.sandboxes.factory import create_sandbox

    repo = tmp_path / "repo"
    (repo / "pkg" / "sub").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "AGENTS.md").write_text("Root rule.")
    (repo / "pkg" / "sub" / "CLOVER.md").write_text("Deep rule.")
    (repo / "pkg" / "AGENTS.md").write_text("Package rule.")
    (repo / "données").mkdir()  # git quotes such paths unless told not to
    (repo / "données" / "CLOVER.md").write_text("Data rule.")
    for name in ("pkg/a.py", "pkg/sub/b.py", "tests/test_a.py", "web.ts", "ignored.log"):
        (repo / name).write_text("x\n")
    (repo / ".gitignore").write_text("*.log\n")
    (repo / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    async with create_sandbox("local", sandbox_spec(repo)) as sandbox:
        facts = await gather_facts(sandbox)
    assert dict(facts.languages) == {"Python": 3, "Markdown": 4, "TypeScript": 1, "TOML": 1}
    assert facts.test_command == "python -m pytest"
    assert facts.top_level == [
        "données/",
        "pkg/",
        "tests/",
        ".gitignore",
        "AGENTS.md",
        "pyproject.toml",
        "web.ts",
    ]
    assert facts.instructions == [
        ("/workspace/AGENTS.md", "Root rule."),
        ("/workspace/données/CLOVER.md", "Data rule."),
        ("/workspace/pkg/AGENTS.md", "Package rule."),
        ("/workspace/pkg/sub/CLOVER.md", "Deep rule."),
    ]


async def test_instruction_files_that_are_huge_or_unreadable_do_not_end_the_run(tmp_path) -> None:
    """A repository's AGENTS.md is its content: a huge one moves only its start out of the sandbox,
    and one that cannot be read (here a dangling link) is named instead of failing the run."""
    import subprocess

    from clover_agent.agent.system_prompt import MAX_INSTRUCTION_CHARS, gather_facts
    from clover_agent.sandboxes.factory import create_sandbox

    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "AGENTS.md").write_text("Rule. " + "x" * (3 * 1024 * 1024) + "\nsecond line\n")
    (repo / "pkg" / "AGENTS.md").symlink_to("no-such-file.md")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    async with create_sandbox("local", sandbox_spec(repo)) as sandbox:
        facts = await gather_facts(sandbox)
    (root, root_text), (pkg, pkg_text) = facts.instructions
    assert root == "/workspace/AGENTS.md" and root_text.startswith("Rule. xxx")
    assert root_text.endswith(f"[… cut at {MAX_INSTRUCTION_CHARS} characters; read /workspace/AGENTS.md]")
    assert len(root_text) < MAX_INSTRUCTION_CHARS + 100
    assert pkg == "/workspace/pkg/AGENTS.md" and pkg_text.startswith(
        "[/workspace/pkg/AGENTS.md could not be read"
    )
    assert "Rule." in system_prompt(facts)
