"""Tensor comparisons in tests/engine and tests/kernels hold on any CPU (tests/tolerance_policy.py):
each float comparison names its tolerance, each exact one says why it is exact; and the check does
fail on a comparison against that."""

from __future__ import annotations

from pathlib import Path

from tests.tolerance_policy import FOLDERS, check, violations


def test_every_tensor_comparison_names_its_tolerance_or_why_it_is_exact() -> None:
    found = violations()
    assert not found, "comparisons against tests/tolerance_policy.py:\n" + "\n".join(map(str, found))


def test_the_check_reads_the_real_tests(tmp_path: Path) -> None:
    """It is not blind: a real test file passes as it is, and fails once its exact tags and
    tolerances are taken out."""
    real = FOLDERS[0] / "test_host_syncs.py"
    text = real.read_text(encoding="utf-8")
    assert check(real) == []
    stripped = tmp_path / real.name
    stripped.write_text(text.replace("# exact:", "#").replace(", rtol=1e-4, atol=1e-4", ""), encoding="utf-8")
    problems = {f.problem for f in check(stripped)}
    assert problems == {
        "exact equal without '# exact: <why>'",
        "assert_close without an explicit atol and rtol",
    }


SNIPPET_BAD = """\
import numpy as np
import torch


def test_bare() -> None:
    a, b = torch.ones(3), torch.ones(3)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a, b, rtol=1e-5)
    assert torch.allclose(a, b)
    assert a.allclose(b, atol=1e-6)
    assert torch.equal(a, b)
    assert (a == b).all()
    assert not torch.any(a != b)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert torch.equal(a, b)  # exact:
"""

SNIPPET_GOOD = """\
import math

import numpy as np
import torch


def test_explicit() -> None:
    a, b = torch.ones(3), torch.ones(3)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # op order only
    assert torch.allclose(a, b, rtol=0.0, atol=1e-3)
    assert torch.equal(a, b)  # exact: a copy
    # exact: integer ids, compared row by row
    assert (a.long() == b.long()).all()
    assert all(  # exact: state a read-only pass leaves alone
        torch.equal(x, y) for x, y in zip(a, b)
    )
    assert torch.isfinite(a).all() and (a > 0).all()  # not comparisons of two results
    assert a.tolist() == [1.0, 1.0, 1.0] and math.isclose(a.sum().item(), 3.0, rel_tol=1e-6)
"""


def test_a_bare_comparison_fails_the_check(tmp_path: Path) -> None:
    """A synthetic test file: the same checker that passes on the real tree names each bare
    comparison (a tolerance keyword missing, an exact one untagged or tagged without a reason)."""
    good = tmp_path / "test_good.py"
    good.write_text(SNIPPET_GOOD)
    assert check(good) == []
    assert violations([tmp_path]) == []

    bad = tmp_path / "test_bad.py"
    bad.write_text(SNIPPET_BAD)
    found = {(f.line, f.problem) for f in violations([tmp_path])}
    assert found == {
        (7, "assert_close without an explicit atol and rtol"),
        (8, "assert_close without an explicit atol"),
        (9, "allclose without an explicit atol and rtol"),
        (10, "allclose without an explicit rtol"),
        (11, "exact equal without '# exact: <why>'"),
        (12, "exact all without '# exact: <why>'"),
        (13, "exact any without '# exact: <why>'"),
        (14, "exact assert_array_equal without '# exact: <why>'"),
        (15, "exact equal without '# exact: <why>'"),  # a tag needs its reason
    }
    assert str(check(bad)[0]) == f"{bad}:7: assert_close without an explicit atol and rtol"
