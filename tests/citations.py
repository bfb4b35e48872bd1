"""Files that docstrings and comments cite, and a checker that finds each one the repository lacks.

The repository must not cite what it does not have: a design note a comment points to lives in
docs/, a test named in a docstring exists. The checker reads the comments (``tokenize``) and
docstrings (``ast``) of every ``.py`` file in the source, test, bench and script folders, and the
repository's Markdown notes; nothing is imported or run. Each path-like word must name a file under
the repository root or beside the citing file.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

from clover_agent.settings import REPO_CONFIG
from tests.import_layers import SIBLINGS

ROOT = Path(__file__).resolve().parents[1]
#: The folders whose ``.py`` files are read (comments and docstrings).
FOLDERS = ("clover_agent", *SIBLINGS, "tests", "bench", "scripts")
#: The repository's own notes, read whole.
NOTES = ("README.md", "docs/*.md", "sandboxes/README.md", "bench/RESULTS.md")
#: What a cited file's name ends with.
EXTENSIONS = ("md", "py", "json", "toml", "jinja", "sh", "yml", "yaml")

_WORD = re.compile(r"[\w./~*?{}<>\[\]$-]+\.(?:" + "|".join(EXTENSIONS) + r")(?![\w/-]|\.\w)")
#: A capitalised note cited by its name alone (``README.md``); other bare names are modules or
#: data files named for what they are (``ops.py``, ``config.json``), not cited.
_NOTE = re.compile(r"[A-Z][A-Z0-9_-]*\.md")
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S*")
#: What follows a file named at a past commit (``clover_agent/protocol.py`` at da20bd8).
_AT_COMMIT = re.compile(r"`*\s+at\s+[0-9a-f]{7,40}\b")
#: Shapes that name no file of this repository: a place in a sandbox or on a user's machine, a file
#: of the repository the agent works on, a pattern or a placeholder.
NOT_CITATIONS: tuple[re.Pattern[str], ...] = (
    re.compile(r"^/(?:workspace|tmp)/"),  # inside a sandbox
    re.compile(r"^~"),  # a user's home
    re.compile(r"^[ab]/"),  # a side of a diff (``a/workspace/x.py``)
    re.compile(r"^[A-Z][A-Z_]*/"),  # under a folder given as an argument (``OUT/result.json``)
    re.compile("^" + re.escape(REPO_CONFIG.parent.as_posix()) + "/"),  # a worked-on repository's config
    re.compile(r"[*?{}<>\[\]$]"),  # a glob or a placeholder (``tests/*.py``, ``$OUT/x.json``)
)


@dataclass(frozen=True)
class Citation:
    file: Path
    line: int
    path: str

    def __str__(self) -> str:
        shown = self.file.relative_to(ROOT) if self.file.is_relative_to(ROOT) else self.file
        return f"{shown}:{self.line}: {self.path}"


def _texts(source: str) -> tuple[list[tuple[int, str]], set[str]]:
    """Every comment and docstring of a module with the line it starts on, and its other strings."""
    texts = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    docstrings: set[int] = set()
    for node in ast.walk(tree := ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0].value if node.body and isinstance(node.body[0], ast.Expr) else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                texts.append((first.lineno, first.value))
                docstrings.add(id(first))
    strings = {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    }
    return texts, strings


def cited_paths(text: str) -> list[tuple[int, str]]:
    """The path-like words of one text (a comment, a docstring, a note), with their line offset in it."""
    words: list[tuple[int, str]] = []
    for offset, line in enumerate(text.splitlines()):
        line = _URL.sub(" ", line)
        for match in _WORD.finditer(line):
            word = match.group().removeprefix("./")
            if "/" not in word and not _NOTE.fullmatch(word):
                continue
            if line.startswith("::", match.end()):
                continue  # a test id of the repository under test (``tests/test_x.py::test_y``)
            if _AT_COMMIT.match(line, match.end()):
                continue
            if any(shape.search(word) for shape in NOT_CITATIONS):
                continue
            words.append((offset, word))
    return words


def citations(path: Path) -> list[Citation]:
    """The files cited in the comments and docstrings of one ``.py`` file.

    A name the module itself holds as a string (``"/workspace/NOTES.md"``) is a file it writes or
    reads in another tree, not a citation."""
    texts, strings = _texts(path.read_text(encoding="utf-8"))
    return [
        Citation(path, line + offset, word)
        for line, text in sorted(texts)
        for offset, word in cited_paths(text)
        if not any(string.endswith(word) for string in strings)
    ]


def _exists(citation: Citation, root: Path) -> bool:
    """Whether the cited file is in the repository: an absolute path, or one that climbs out of the
    root with ``..``, names a place on one machine, never a file the repository has."""
    if citation.path.startswith("/"):
        return False
    for base in (root, citation.file.parent):
        target = (base / citation.path).resolve()
        if target.is_relative_to(root.resolve()) and target.exists():
            return True
    return False


def note_citations(path: Path) -> list[Citation]:
    """The files cited anywhere in one Markdown note."""
    return [
        Citation(path, offset + 1, word) for offset, word in cited_paths(path.read_text(encoding="utf-8"))
    ]


def missing(
    root: Path = ROOT, folders: tuple[str, ...] = FOLDERS, notes: tuple[str, ...] = NOTES
) -> list[Citation]:
    """Citations of files that exist neither under ``root`` nor beside the citing file."""
    found = [
        citation
        for folder in folders
        for path in sorted((root / folder).rglob("*.py"))
        for citation in citations(path)
    ]
    found += [
        citation
        for pattern in notes
        for path in sorted(root.glob(pattern))
        for citation in note_citations(path)
    ]
    return [citation for citation in found if not _exists(citation, root)]
