"""The repository cites only files it has (tests/citations.py): every path in a docstring or comment
of the code, tests, benchmarks and scripts, and in the Markdown notes, exists; and the check does
fail on one that does not."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.citations import ROOT, citations, missing, note_citations


def test_docstrings_and_comments_cite_only_files_the_repository_has() -> None:
    found = [str(citation) for citation in missing()]
    assert not found, "cited files the repository does not have:\n" + "\n".join(found)


def test_the_checker_reads_the_real_tree() -> None:
    cited = {citation.path for citation in citations(ROOT / "engine" / "decoding" / "decoder.py")}
    assert "docs/decoding.md" in cited  # the module docstring's first line
    cited = {citation.path for citation in citations(ROOT / "engine" / "model" / "config.py")}
    assert "docs/decoding.md" in cited  # a comment
    assert "docs/tools.md" in {citation.path for citation in note_citations(ROOT / "README.md")}


def test_a_missing_file_fails_the_check(tmp_path: Path) -> None:
    """A synthetic repository: the same checker that passes on the real tree names each citation of
    a file it lacks, in a docstring, a comment or a note, and leaves alone what names no file of its
    own."""
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "here.md").write_text(
        "# A note\n"
        "Rules in engine/sibling.py and docs/gone.md; writes OUT/result.json; `engine/old.py` at 1a2b3c4d.\n"
    )
    (root / "engine").mkdir()
    (root / "engine" / "sibling.py").write_text("")
    (tmp_path / "outside.md").write_text("beside the repository, not in it\n")
    elsewhere = Path(ast.__file__).resolve().as_posix()  # a file that exists on this machine
    (root / "engine" / "mod.py").write_text(
        '"""What this does; the rule is in docs/here.md.\n'  # 1: exists
        "\n"
        'Details: docs/nowhere.md and ``DESIGN.md``."""\n'  # 3: both missing
        "\n"
        "# See ../outside.md and engine/sibling.py or sibling.py.\n"  # 5: climbs out; the others exist
        f"# Also {elsewhere}.\n"  # 6: absolute, so never the repository's
        "PATH = 'docs/gone.md'  # a string, not a citation: runtime code may name anything\n"
        "NOTES = '/workspace/NOTES.md'\n"
        "\n"
        "\n"
        "def f() -> None:\n"
        '    """Reads NOTES.md in the sandbox; runs tests/test_x.py::test_y and tests/*.py."""\n'
        "    # /workspace/src/x.py, /tmp/run.sh, ~/x.toml, $OUT/r.json, a/workspace/x.py, b/y.py\n"
        "    # .clover/config.toml of the repository worked on; https://example.org/docs/x.md\n"
        "    # modules named bare: ops.py, config.json; docs/here.md.\n"
    )
    flagged = [(c.file.name, c.line, c.path) for c in missing(root, ("engine",))]
    assert flagged == [
        ("mod.py", 3, "docs/nowhere.md"),
        ("mod.py", 3, "DESIGN.md"),
        ("mod.py", 5, "../outside.md"),
        ("mod.py", 6, elsewhere),
        ("here.md", 2, "docs/gone.md"),
    ]

    (root / "docs" / "nowhere.md").write_text("now it is here\n")
    (root / "DESIGN.md").write_text("and this\n")
    (root / "docs" / "gone.md").write_text("and this\n")
    assert [c.path for c in missing(root, ("engine",))] == ["../outside.md", elsewhere]
