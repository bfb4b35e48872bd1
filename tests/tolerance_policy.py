"""How tests/engine and tests/kernels compare tensors, and a checker that finds each comparison
against it.

Two code paths (eager and traced, torch and Triton, ours and transformers) agree to a tolerance,
not bit for bit: another CPU's BLAS or oneDNN kernels order a reduction differently. So every
``assert_close`` / ``allclose`` / ``isclose`` names both ``rtol`` and ``atol`` (a comment says why
that size), and an exact comparison (``torch.equal``, ``array_equal``, ``(a == b).all()``) carries
``# exact: <why>`` on its statement or in the comment lines right above it: integer ids or masks,
a copy, state a pass must leave alone, the same call run twice. The checker reads the syntax tree
and the comments (nothing is imported or run).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterable
from pathlib import Path

from tests.findings import Finding

ROOT = Path(__file__).resolve().parents[1]
#: The test folders whose tensor comparisons the policy covers.
FOLDERS = (ROOT / "tests" / "engine", ROOT / "tests" / "kernels")

#: Calls that compare to a tolerance: both ``rtol`` and ``atol`` must be given (``math.isclose``,
#: which compares numbers with ``rel_tol``, is not one of them).
TOLERANT = {"assert_close", "allclose", "assert_allclose", "isclose"}
#: Calls that compare bit for bit: they need the exact tag.
EXACT = {"equal", "array_equal", "assert_array_equal"}
EXACT_TAG = re.compile(r"#.*\bexact:\s*\S")


def _name(func: ast.expr) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _is_equality(node: ast.expr) -> bool:
    """``a == b`` / ``a != b`` or ``torch.eq(a, b)`` / ``a.eq(b)``: an element-wise exact test."""
    if isinstance(node, ast.Compare):
        return all(isinstance(op, ast.Eq | ast.NotEq) for op in node.ops)
    return isinstance(node, ast.Call) and _name(node.func) in {"eq", "ne"}


def _exact_reduction(call: ast.Call) -> bool:
    """``(a == b).all()`` / ``.any()``, or ``torch.all(a == b)`` / ``torch.any(...)``."""
    func = call.func
    if not isinstance(func, ast.Attribute) or func.attr not in {"all", "any"}:
        return False
    if _is_equality(func.value):
        return True
    return (
        isinstance(func.value, ast.Name)
        and func.value.id == "torch"
        and bool(call.args)
        and _is_equality(call.args[0])
    )


def _comments(text: str) -> tuple[set[int], set[int]]:
    """(lines with an exact tag, lines that hold only a comment)."""
    tagged, alone = set(), set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            if EXACT_TAG.search(tok.string):
                tagged.add(tok.start[0])
            if tok.line.lstrip().startswith("#"):
                alone.add(tok.start[0])
    return tagged, alone


def check(path: Path) -> list[Finding]:
    """Every comparison in ``path`` that breaks the policy."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text, str(path))
    tagged, alone = _comments(text)

    def is_tagged(first: int, last: int) -> bool:
        while first - 1 in alone:  # the comment block right above the statement
            first -= 1
        return bool(tagged & set(range(first, last + 1)))

    found: list[Finding] = []

    def visit(node: ast.AST, statement: ast.stmt | None) -> None:
        if isinstance(node, ast.stmt):
            statement = node
        if isinstance(node, ast.Call):
            name = _name(node.func)
            given = {kw.arg for kw in node.keywords}
            on_math = isinstance(node.func, ast.Attribute) and _name(node.func.value) == "math"
            if name in TOLERANT and not on_math and not {"rtol", "atol"} <= given:
                missing = " and ".join(sorted({"rtol", "atol"} - given))
                found.append(Finding(str(path), node.lineno, f"{name} without an explicit {missing}"))
            elif name in EXACT or _exact_reduction(node):
                first = statement.lineno if statement else node.lineno
                if not is_tagged(first, node.end_lineno or node.lineno):
                    found.append(Finding(str(path), node.lineno, f"exact {name} without '# exact: <why>'"))
        for child in ast.iter_child_nodes(node):
            visit(child, statement)

    visit(tree, None)
    return sorted(found)


def violations(folders: Iterable[Path] = FOLDERS) -> list[Finding]:
    """Every comparison against the policy in the test files under ``folders``."""
    return [finding for folder in folders for path in sorted(folder.rglob("*.py")) for finding in check(path)]
