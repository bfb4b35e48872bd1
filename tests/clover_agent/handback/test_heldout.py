"""What the held-out run puts back, and what it names, on real shadow repositories (no sandbox)."""

from __future__ import annotations

from pathlib import Path

from clover_agent.handback.heldout import changed_target_tests, files_with_tests, held_out, plugin_modules
from clover_agent.handback.shadow import EXECUTABLE, REGULAR, ShadowRepo
from clover_agent.handback.stock import PatchSet

TEST = b"from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"


def patch_between(tmp_path: Path, before: dict[str, bytes], after: dict[str, bytes]) -> PatchSet:
    shadow = ShadowRepo(tmp_path / "shadow.git")
    writer = shadow.writer("refs/heads/base")
    for path, data in before.items():
        writer.put(path, EXECUTABLE if path.endswith(".sh") else REGULAR, data)
    base = writer.finish()
    writer = shadow.writer("refs/heads/final", base)
    for path in set(before) - set(after):
        writer.delete(path)
    for path, data in after.items():
        if before.get(path) != data:
            writer.put(path, REGULAR, data)
    final = writer.finish()
    return PatchSet(shadow, base, final, shadow.patch(base, final), shadow.changes(base, final))


def test_the_harness_goes_back_and_the_source_stays(tmp_path: Path) -> None:
    before = {
        "calc.py": b"def add(a, b):\n    return a - b\n",
        "tests/test_calc.py": TEST,
        "pyproject.toml": b'[project]\nname = "calc"\n\n[tool.pytest.ini_options]\naddopts = "-p checks"\n',
        "checks.py": b"X = 1\n",
        "setup.cfg": b"[flake8]\nmax-line-length = 100\n",
    }
    after = {
        **before,
        "calc.py": b"def add(a, b):\n    return a + b\n",
        "helper.py": b"Y = 2\n",  # a new source module: code under test
        "tests/test_calc.py": TEST.replace(b"== 5", b"== -1"),
        "tests/test_new.py": b"def test_new():\n    pass\n",
        "conftest.py": b"import calc\n",
        "checks.py": b"X = 2\n",  # a plugin the original configuration names
        "pyproject.toml": before["pyproject.toml"].replace(b'name = "calc"', b'name = "calc2"'),
        "setup.cfg": b"[flake8]\nmax-line-length = 120\n",
        "pytest.py": b"raise SystemExit\n",
        "json.py": b"",  # shadows the standard library, but pytest has it already: only named
        "src/x.pth": b"import os\n",
    }
    plan = held_out(
        patch_between(tmp_path, before, after),
        target_ids=["tests/test_calc.py::test_add"],
        installed={"pytest", "json", "os"},
        harness_modules={"pytest"},
    )
    puts = {p.path: p for p in plan.puts}
    assert set(puts) == set(plan.reverted) == {
        "tests/test_calc.py", "tests/test_new.py", "conftest.py", "checks.py", "pytest.py", "src/x.pth",
    }  # fmt: skip
    assert puts["tests/test_calc.py"].data == TEST and puts["checks.py"].data == b"X = 1\n"
    assert {puts[p].kind for p in ("tests/test_new.py", "conftest.py", "pytest.py", "src/x.pth")} == {
        "absent"
    }
    assert "calc.py" not in puts and "helper.py" not in puts and "json.py" not in puts
    assert sorted(plan.harness) == sorted(
        [
            "tests/test_calc.py: modified test file",
            "tests/test_new.py: added test file",
            "conftest.py: a new conftest.py",
            "checks.py: a plugin the pytest configuration loads",
            "json.py: a new module that shadows the installed `json`",
            "pytest.py: a new module that shadows the installed `pytest`",
            "src/x.pth: a pth file, read when Python starts",
            "tests/test_calc.py::test_add: the test's body changed",
        ]
    )
    # pyproject's pytest table did not change, setup.cfg has none: both stay as patched, unnamed
    assert not any("configuration changed" in h for h in plan.harness)


def test_files_that_held_tests_are_held_out_whatever_their_name_and_new_config_files_too(
    tmp_path: Path,
) -> None:
    """A project whose tests pytest finds by its own ``python_files`` (``checks.py``), and a
    ``pytest.toml`` (pytest 9 reads it before pyproject.toml) that names a plugin."""
    before = {"calc.py": b"X = 1\n", "checks.py": TEST, "tox.ini": b"[testenv]\ncommands = mypy -p calc\n"}
    after = {
        **before,
        "checks.py": TEST.replace(b"== 5", b"== -1"),
        "calc.py": b"X = 2\n",
        "pytest.toml": b'[pytest]\naddopts = ["-p", "helpers"]\n',
        "helpers.py": b"",
        "clover_live_results.py": b"",
    }
    plan = held_out(
        patch_between(tmp_path, before, after),
        target_ids=["checks.py::test_add"],
        installed={"pytest"},
        harness_modules={"pytest"},
        test_files=frozenset({"checks.py"}),
    )
    # mypy's -p in tox.ini names no pytest plugin: calc.py, the fix, stays
    assert sorted(plan.reverted) == ["checks.py", "pytest.toml"]
    assert "pytest.toml: the pytest configuration changed" in plan.harness
    assert "checks.py::test_add: the test's body changed" in plan.harness


def test_a_module_whose_tests_are_its_doctests_is_code_and_stays_as_patched(tmp_path: Path) -> None:
    """``--doctest-modules``: the suite's ids name the modules' doctests (a src layout's by the
    import name); the fix in such a module, its doctest updated with it, is not put back."""
    ids = [
        "zipp/__init__.py::zipp.Path",
        "zipp/_functools.py::zipp._functools.none_as",
        "src/zope/fmt/core.py::zope.fmt.core",
        "tests/test_path.py::TestPath::test_str",
        "checks.py::test_add",
        "mixed.py::mixed.f",
        "mixed.py::test_g",
        "README.rst::README.rst",
    ]
    files = files_with_tests(ids)
    assert files == {"tests/test_path.py", "checks.py", "mixed.py", "README.rst"}
    before = {"zipp/__init__.py": b'def f():\n    """\n    >>> f()\n    1\n    """\n    return 2\n'}
    after = {"zipp/__init__.py": before["zipp/__init__.py"].replace(b"1\n", b"2\n")}
    plan = held_out(
        patch_between(tmp_path, before, after),
        target_ids=["tests/test_path.py::TestPath::test_str"],
        installed={"pytest"},
        harness_modules={"pytest"},
        test_files=files,
    )
    assert plan.puts == [] and plan.reverted == []


def test_an_honest_patch_changes_nothing_that_judges_it(tmp_path: Path) -> None:
    before = {"calc.py": b"def add(a, b):\n    return a - b\n", "tests/test_calc.py": TEST}
    after = {**before, "calc.py": b"def add(a, b):\n    return a + b\n", "calc_util.py": b"Z = 3\n"}
    plan = held_out(
        patch_between(tmp_path, before, after),
        target_ids=["tests/test_calc.py::test_add"],
        installed={"pytest"},
        harness_modules={"pytest"},
    )
    assert plan.puts == [] and plan.reverted == [] and plan.harness == []


def test_a_test_defined_again_further_down_or_changed_is_named() -> None:
    ids = ["t.py::test_a", "t.py::TestC::test_b[1]", "t.py::test_same"]
    old = b"def test_a():\n    assert f()\n\nclass TestC:\n    def test_b(self, n):\n    \tassert g(n)\n\ndef test_same():\n    pass\n"
    old = old.replace(b"    \t", b"        ")
    new = (
        old.replace(b"assert g(n)", b"assert g(n) or True")
        + b"\n\ndef test_a():\n    assert True\n\n\ndef helper():\n    pass\n"
    )
    assert changed_target_tests(ids, {"t.py": old}, {"t.py": new}) == [
        "t.py::test_a: defined 2 times in its file (the last one runs)",
        "t.py::TestC::test_b[1]: the test's body changed",
    ]


def test_plugins_named_by_the_configuration() -> None:
    files = {
        "pytest.ini": b"[pytest]\naddopts = -p my.plugin -p no:cacheprovider -pother\n",
        "pyproject.toml": b'[tool.pytest.ini_options]\naddopts = ["-p", "listed"]\n',
        "tests/conftest.py": b'pytest_plugins = ["fixtures.db", "fixtures.web"]\n',
        "sub/conftest.py": b"pytest_plugins = 'single'\n",
    }
    assert plugin_modules(files) == {"my.plugin", "other", "listed", "fixtures.db", "fixtures.web", "single"}
