"""The guarded pytest run (``run_tests_in(..., guarded=True)``): the workspace cannot shadow pytest or
its plugins, and a report rewritten after the tests ran is not a pass. Real pytest in real
sandboxes (local; Docker when there); the same project run plainly shows each attack works there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.tools.run_tests import TestReport, run_tests_in
from clover_agent.tools.run_tests.guarded import (
    CHANNEL_SOURCE,
    cross_check,
    live_outcomes,
    new_key,
    read_stream,
    without_stream,
)
from tests.git_repos import make_repo
from tests.sandbox_specs import sandbox_spec

FAILING = {
    "calc.py": "def add(a, b):\n    return a - b\n",
    "tests/test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
    "def test_zero():\n    assert add(0, 0) == 0\n",
    "pyproject.toml": '[tool.pytest.ini_options]\npythonpath = ["."]\n',
}
#: Rewrites the JUnit report at exit to say every test passed.
REWRITE = (
    "\nimport atexit, re, sys\n"
    "def _rewrite():\n"
    "    for arg in sys.argv:\n"
    "        if arg.startswith('--junitxml='):\n"
    "            path = arg.split('=', 1)[1]\n"
    "            text = re.sub(r'<failure.*?</failure>', '', open(path).read(), flags=re.S)\n"
    "            open(path, 'w').write(text)\n"
    "atexit.register(_rewrite)\n"
)
FAKE_PYTEST = (
    "import sys\n"
    "for arg in sys.argv:\n"
    "    if arg.startswith('--junitxml='):\n"
    "        open(arg.split('=', 1)[1], 'w').write('<testsuites><testsuite><testcase classname=\"tests.test_calc\" '\n"
    '            \'name="test_add" file="tests/test_calc.py"/></testsuite></testsuites>\')\n'
)
#: A plugin registered by package metadata planted in the workspace.
PLANTED = {
    "evil_plugin.py": "import calc\ncalc.add = lambda a, b: a + b\n",
    "evil-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n",
    "evil-1.0.dist-info/entry_points.txt": "[pytest11]\nevil = evil_plugin\n",
}

KINDS = ["local", pytest.param("docker", marks=pytest.mark.docker)]


async def both_runs(tmp_path: Path, kind: str, files: dict[str, str]) -> tuple[TestReport, TestReport]:
    repo = make_repo(tmp_path / "repo", files)
    async with create_sandbox(kind, sandbox_spec(repo)) as sandbox:
        plain = await run_tests_in(sandbox, "tests/test_calc.py")
        guarded = await run_tests_in(sandbox, "tests/test_calc.py", guarded=True)
    return plain, guarded


@pytest.mark.parametrize("kind", KINDS)
async def test_a_report_rewritten_at_exit_by_the_code_under_test_is_not_a_pass(
    tmp_path: Path, kind: str
) -> None:
    files = {**FAILING, "calc.py": FAILING["calc.py"] + REWRITE}
    plain, guarded = await both_runs(tmp_path, kind, files)
    assert plain.outcomes["tests/test_calc.py::test_add"] == "passed"  # the attack works on a plain run
    assert guarded.outcomes == {
        "tests/test_calc.py::test_add": "failed",
        "tests/test_calc.py::test_zero": "passed",
    }
    assert guarded.failed == 1 and guarded.passed == 1 and not guarded.all_passed
    assert "clover-live" not in guarded.output and "assert -1 == 5" in guarded.output


@pytest.mark.parametrize("kind", KINDS)
async def test_a_root_pytest_module_does_not_shadow_pytest(tmp_path: Path, kind: str) -> None:
    plain, guarded = await both_runs(tmp_path, kind, {**FAILING, "pytest.py": FAKE_PYTEST})
    assert plain.outcomes.get("tests/test_calc.py::test_add") == "passed" or plain.problem is not None
    assert guarded.outcomes["tests/test_calc.py::test_add"] == "failed" and guarded.problem is None


async def test_a_plugin_planted_as_package_metadata_is_not_loaded(tmp_path: Path) -> None:
    plain, guarded = await both_runs(tmp_path, "local", {**FAILING, **PLANTED})
    assert plain.outcomes["tests/test_calc.py::test_add"] == "passed"  # autoloaded from the workspace
    assert guarded.outcomes["tests/test_calc.py::test_add"] == "failed"


async def test_an_honest_project_gets_the_same_results_both_ways(tmp_path: Path) -> None:
    files = {
        **FAILING,
        "calc.py": "def add(a, b):\n    return a + b\n",
        "tests/conftest.py": "import pytest\n\n\n@pytest.fixture\ndef two():\n    return 2\n",
        "tests/test_more.py": "import pytest\nfrom calc import add\n\n\ndef test_two(two):\n    assert add(two, two) == 4\n\n\n"
        "@pytest.mark.skip(reason='later')\ndef test_later():\n    pass\n\n\n"
        "@pytest.mark.xfail(strict=True)\ndef test_known_bad():\n    assert add(1, 1) == 3\n\n\n"
        "@pytest.mark.parametrize('n', [1, 2])\ndef test_param(n):\n    assert add(n, 0) == n\n",
    }
    repo = make_repo(tmp_path / "repo", files)
    async with create_sandbox("local", sandbox_spec(repo)) as sandbox:
        plain = await run_tests_in(sandbox, None)
        guarded = await run_tests_in(sandbox, None, guarded=True)
    assert plain.outcomes == guarded.outcomes and guarded.all_passed
    assert (guarded.passed, guarded.skipped) == (plain.passed, plain.skipped) == (5, 2)


def channel_output(tmp_path: Path, key: str, script: str) -> str:
    """What a process that opened the results channel with ``key`` and then ran ``script`` (which
    may call ``send``) printed; the key file is gone after the channel is opened."""
    key_file = tmp_path / "k"
    key_file.write_text(key)
    code = (
        CHANNEL_SOURCE
        + f"\nsend, off = _channel({str(key_file)!r})\nimport os\nassert not os.path.exists({str(key_file)!r})\n"
        + script
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout


def test_the_channel_reads_only_signed_records_in_sequence_one_per_phase(tmp_path: Path) -> None:
    key = new_key()
    script = (
        "send('start')\n"
        "send('call', 'failed', False, 't.py::a')\n"
        # forged records: another key, and a made-up digest, both for a test that failed
        "print('\\x1eclover-live ' + '0' * 64 + ' 2 call passed 0 ' + 't.py::a'.encode().hex())\n"
        "send('setup', 'skipped', True, 't.py::c')\n"
        "send('setup', 'passed', False, 't.py::d')\n"
        "send('teardown', 'failed', False, 't.py::d')\n"
        "send('call', 'passed', False, 't.py::e')\n"
        "send('call', 'rerun', False, 't.py::f')\n"
        "send('call', 'passed', False, 't.py::f')\n"
        "send('finish', '0')\n"
    )
    output = channel_output(tmp_path, key, script)
    other = channel_output(tmp_path, new_key(), "send('start')\nsend('call', 'passed', False, 't.py::a')\n")
    stream = read_stream(output + other, key)
    assert stream.outcomes() == {
        "t.py::a": "failed",
        "t.py::c": "skipped",  # xfail
        "t.py::d": "error",
        "t.py::e": "passed",
        "t.py::f": "passed",  # a rerun plugin's first try does not count
    }
    assert stream.finished
    assert stream.problems == [
        "3 result record(s) were not written by the runner (the run's key does not sign them)"
    ]
    assert live_outcomes(output, key) == stream.outcomes()
    assert "clover-live" not in without_stream(output)

    # a second result for one phase, a replayed record, a gap, and no end of session
    lines = [line for line in output.split("\n") if "clover-live" in line]
    e_call = next(line for line in lines if b"t.py::e".hex() in line)
    tampered = "\n".join([*lines[:2], lines[2].replace("2 call", "9 call"), *lines[3:6], e_call, e_call])
    stream = read_stream(tampered, key)
    assert stream.outcomes()["t.py::a"] == "failed"
    assert not stream.finished
    assert any("came again" in p for p in stream.problems)
    # the forged line with a changed number is still forged (the digest covers the number)
    assert any("not written by the runner" in p for p in stream.problems)
    # a later, signed record for a phase already reported: the runner's own records say it twice
    later = channel_output(
        tmp_path,
        key,
        "send('start')\n"
        + "\n".join(f"send('call', 'passed', False, 't.py::x{i}')" for i in range(6))
        + "\nsend('call', 'failed', False, 't.py::x1')\nsend('finish', '0')\n",
    )
    stream = read_stream(later, key)
    assert stream.outcomes()["t.py::x1"] == "error" and stream.outcomes()["t.py::x0"] == "passed"
    assert stream.problems == ["two results were reported for one phase of: t.py::x1"]


def test_the_report_says_no_more_than_the_channel() -> None:
    report = TestReport(
        framework="pytest",
        command="",
        target=None,
        exit_code=0,
        passed=3,
        outcomes={"t.py::a": "passed", "t.py::e": "passed", "t.py::gone": "passed"},
    )
    changed = cross_check(report, {"t.py::a": "failed", "t.py::e": "passed", "t.py::new": "error"})
    assert sorted(changed) == ["t.py::a", "t.py::gone", "t.py::new"]
    assert report.outcomes == {
        "t.py::a": "failed",
        "t.py::e": "passed",
        "t.py::gone": "error",
        "t.py::new": "error",
    }
    assert (report.passed, report.failed, report.errors) == (1, 1, 2)
