"""Module docstrings of the package say what and why in a few lines, with no measurement in them
(tests/docstrings.py states the rule: at most 12 lines; no number with a unit of time, speed or
size); and the check does fail on a module that breaks it."""

from __future__ import annotations

from pathlib import Path

from tests.docstrings import MAX_LINES, ROOT, check, findings, module_docstring

#: Module docstrings still too long, each with why it is still here. An entry that no longer
#: breaks the rule fails the test, so the list only shrinks.
KNOWN: dict[str, str] = {}


def test_module_docstrings_are_short_and_hold_no_measurement() -> None:
    found = findings()
    unexpected = [str(finding) for finding in found if finding.path not in KNOWN]
    assert not unexpected, "module docstrings that break the rule:\n" + "\n".join(unexpected)
    stale = set(KNOWN) - {finding.path for finding in found}
    assert not stale, f"these now keep the rule; remove them from KNOWN: {sorted(stale)}"


def test_the_checker_reads_the_real_tree(tmp_path: Path) -> None:
    source = (ROOT / "clover_agent" / "fix" / "workflow.py").read_text()
    found = module_docstring(source)
    assert found is not None and found[1].startswith("The ``fix`` workflow")
    assert check("clover_agent/fix/workflow.py", source) == []
    # The same module with its docstring grown past the limit is flagged.
    (tmp_path / "clover_agent" / "fix").mkdir(parents=True)
    grown = source.replace('"""', '"""' + "More.\n" * MAX_LINES, 1)
    (tmp_path / "clover_agent" / "fix" / "workflow.py").write_text(grown)
    assert [f.path for f in findings(tmp_path, ("clover_agent",))] == ["clover_agent/fix/workflow.py"]


def test_a_long_docstring_or_a_measurement_fails_the_check(tmp_path: Path) -> None:
    """A synthetic package: the same checker that passes on the real tree names a docstring over
    the limit and each measurement, and leaves alone a short one whose numbers measure nothing."""
    package = tmp_path / "engine"
    package.mkdir()
    long_text = "\n".join(f"Line {n} of the story." for n in range(2, MAX_LINES + 2))
    (package / "long.py").write_text(f'"""What this is.\n\n{long_text}\n"""\n\nX = 1\n')
    (package / "fast.py").write_text(
        '"""A fast path.\n'
        "\n"
        "One forward takes ~35 ms on a CPU, 41 tok/s, and the weights are 69 GB (8 GiB on disk, 512 MiB\n"
        'free); it is 2.3x faster than before, a run takes 4.2 s or 2 min."""\n'
    )
    (package / "clean.py").write_text(
        '"""A clean module: what it is and why.\n'
        "\n"
        "Python 3.11, 32-token blocks, 248,320 rows, mode 0600, exit 4, 2 x block_size tokens, a\n"
        "module over 400 lines, Clover-35B-A3B, files over ``MAX_FILE_BYTES``, ``sha256``.\n"
        '"""\n'
    )
    (package / "none.py").write_text("X = '''not a docstring: 10 ms'''\n")
    exactly = "\n".join(f"Line {n}." for n in range(2, MAX_LINES + 1))
    (package / "exact.py").write_text(f'"""Exactly at the limit.\n{exactly}\n"""\n')

    flagged = [(f.path, f.line, f.problem) for f in findings(tmp_path, ("engine",))]
    on_line_3 = ("~35 ms", "41 tok/s", "69 GB", "8 GiB", "512 MiB")
    on_line_4 = ("2.3x faster", "4.2 s", "2 min")
    assert flagged == sorted(
        [("engine/long.py", 1, f"module docstring of {MAX_LINES + 2} lines (at most {MAX_LINES})")]
        + [("engine/fast.py", 3, f"a measurement in the module docstring: {m!r}") for m in on_line_3]
        + [("engine/fast.py", 4, f"a measurement in the module docstring: {m!r}") for m in on_line_4]
    )

    (package / "long.py").write_text('"""What this is, and why."""\n')
    (package / "fast.py").write_text('"""A fast path: bench/RESULTS.md has its figures."""\n')
    assert findings(tmp_path, ("engine",)) == []
