"""What the model is told: the system prompt, with facts about the repository.

The system prompt carries facts about the repository (languages by file count, the test command,
the top-level tree) and every AGENTS.md / CLOVER.md from the repository root down, root first so
the instructions nearest the code come last, each introduced by its path.

The instruction files are the repository's (so the model's) content: each is read in the sandbox up
to :data:`MAX_INSTRUCTION_BYTES` whatever its size, and one that cannot be read (a FIFO, a dangling
link, no permission) is named in the prompt instead of ending the run.
"""

from __future__ import annotations

import posixpath
from collections import Counter
from dataclasses import dataclass

from clover_agent.sandboxes.base import WORKSPACE, Sandbox
from clover_agent.tools.run_tests import detect_framework

INSTRUCTION_FILES = ("AGENTS.md", "CLOVER.md")
#: Characters of one instruction file put in the prompt (the rest is named, not inlined).
MAX_INSTRUCTION_CHARS = 12_000
#: Bytes of one instruction file moved out of the sandbox (UTF-8 takes at most 4 per character).
MAX_INSTRUCTION_BYTES = 4 * MAX_INSTRUCTION_CHARS
MAX_TREE_ENTRIES = 50

#: What to tell the model about running tests, by the framework ``run_tests`` detects.
TEST_COMMANDS = {
    "pytest": "python -m pytest",
    "unittest": "python -m unittest",
    "npm": "npm test",
    "go": "go test ./...",
    "cargo": "cargo test",
}

LANGUAGES = {
    ".py": "Python",
    ".pyi": "Python",
    ".js": "JavaScript",
    ".mjs": "JavaScript",
    ".jsx": "JavaScript",
    ".ts": "TypeScript",
    ".tsx": "TypeScript",
    ".go": "Go",
    ".rs": "Rust",
    ".java": "Java",
    ".kt": "Kotlin",
    ".c": "C",
    ".h": "C",
    ".cc": "C++",
    ".cpp": "C++",
    ".hpp": "C++",
    ".cs": "C#",
    ".rb": "Ruby",
    ".php": "PHP",
    ".swift": "Swift",
    ".scala": "Scala",
    ".sh": "Shell",
    ".md": "Markdown",
    ".rst": "reStructuredText",
    ".toml": "TOML",
    ".yaml": "YAML",
    ".yml": "YAML",
    ".json": "JSON",
    ".html": "HTML",
    ".css": "CSS",
    ".sql": "SQL",
}

ROLE = """\
You are Clover, a coding agent. You work in a sandboxed copy of a repository at /workspace, \
using the tools you are given; nothing you do there touches the user's files until they accept \
your patch.

How to work:
- Use absolute paths under /workspace.
- Reproduce the problem first (run_tests), read the code involved, then make the smallest change \
that fixes the cause.
- Do not edit tests to make them pass unless the task says the test itself is wrong.
- Re-run the tests after each change. When the task is done, call `finish` with a short summary \
of what you changed and why."""


@dataclass
class RepositoryFacts:
    languages: list[tuple[str, int]]  # (language, file count), most files first
    test_command: str | None
    top_level: list[str]  # names, folders with a trailing "/"
    instructions: list[tuple[str, str]]  # (sandbox path, text), root first


async def gather_facts(sandbox: Sandbox) -> RepositoryFacts:
    """Look at the workspace through the sandbox (so it works the same for Docker and local)."""
    listing = await sandbox.exec(
        "git -c core.quotepath=off ls-files -co --exclude-standard 2>/dev/null || find . -type f -not -path './.git/*' | sed 's|^./||'",
        cwd=WORKSPACE,
        timeout=30,
    )
    files = [line for line in listing.output.splitlines() if line and not line.startswith(".clover/")]
    counts: Counter[str] = Counter()
    for path in files:
        language = LANGUAGES.get(posixpath.splitext(path)[1].lower())
        if language:
            counts[language] += 1
    top: set[str] = set()
    for path in files:
        head, sep, _ = path.partition("/")
        top.add(head + "/" if sep else head)
    instruction_paths = sorted(
        (p for p in files if posixpath.basename(p) in INSTRUCTION_FILES),
        key=lambda p: (p.count("/"), p),
    )
    instructions = []
    for rel in instruction_paths:
        path = posixpath.join(WORKSPACE, rel)
        instructions.append((path, await _instruction_text(sandbox, path)))
    return RepositoryFacts(
        languages=counts.most_common(),
        test_command=TEST_COMMANDS.get(await detect_framework(sandbox)),
        top_level=sorted(top, key=lambda n: (not n.endswith("/"), n)),
        instructions=instructions,
    )


async def _instruction_text(sandbox: Sandbox, path: str) -> str:
    """The start of one instruction file (see the module docstring), or a line saying why not."""
    try:
        head = await sandbox.read_lines(path, 1, -1, max_bytes=MAX_INSTRUCTION_BYTES)
    except OSError as exc:
        return f"[{path} could not be read: {exc.strerror or exc}]"
    text = head.data.decode("utf-8", errors="replace")
    if len(text) > MAX_INSTRUCTION_CHARS or head.truncated:
        text = text[:MAX_INSTRUCTION_CHARS] + f"\n[… cut at {MAX_INSTRUCTION_CHARS} characters; read {path}]"
    return text


def system_prompt(facts: RepositoryFacts) -> str:
    lines = [ROLE, "", "# Repository (/workspace)"]
    if facts.languages:
        lines.append("Languages (files): " + ", ".join(f"{name} {count}" for name, count in facts.languages))
    if facts.test_command:
        lines.append(f"Test command: {facts.test_command} (use the run_tests tool)")
    tree = facts.top_level[:MAX_TREE_ENTRIES]
    more = len(facts.top_level) - len(tree)
    lines.append(
        "Top level: " + ("  ".join(tree) or "(empty)") + (f"  … and {more} more" if more > 0 else "")
    )
    if facts.instructions:
        lines += ["", "# Instructions from the repository (later ones are more specific and take precedence)"]
        for path, text in facts.instructions:
            scope = posixpath.dirname(path)
            lines += ["", f"## {path} (applies to {scope}/)", text.strip()]
    return "\n".join(lines)
