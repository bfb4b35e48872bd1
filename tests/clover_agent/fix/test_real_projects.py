"""``clover-agent fix`` on real third-party projects, with the default Docker sandbox and default
flags: each project's pinned sdist is fetched from the package index, a bug is injected, and the
repair is replayed (the replay backend: recorded turns, not a model). The project's environment is
set up from its own files on the first run and reused from the cache on the second, which is asked
for "the failing test" (whatever the bug breaks, found by running the suite).

Also, each on a real sdist with the defaults and exit code 0 (issue 26's "real projects II"): a C
extension with a pure fallback, its speedups' cases skipped where it is not built and run in the
compiler variant, tox's test requirement file, a test that hangs, a host pip setting named as left
out (markupsafe); the extras its tests import (pydantic-extra-types); the coverage data its test
runs write, left out of the patch and named (python-utils); a setuptools-scm version with no tag
(pluggy). And the environment failures end the run with exit code 4 and one message naming the
cause, before the agent starts, with the user's tree untouched.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from clover_agent.fix.runs import SUMMARY_FILE
from tests.git_repos import git, make_repo
from tests.real_projects import (
    PROJECTS,
    Project,
    drop_image,
    environment_image,
    fetch_sdist,
    inject,
    replay_file,
)

pytestmark = [pytest.mark.docker, pytest.mark.index, pytest.mark.slow]

FIX_TIMEOUT_S = 1500


def fix(
    repo: Path, target: str, replay: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``clover-agent fix TARGET`` with the defaults (Docker sandbox, suite regression runs), the
    repository's .clover/config.toml (these tests write it) trusted."""
    return subprocess.run(
        [sys.executable, "-m", "clover_agent", "fix", target, "--repo", str(repo), "--backend", "replay",
         "--replay", str(replay), "--yes", "--trust-repo"],
        capture_output=True, text=True, timeout=FIX_TIMEOUT_S,
        env={**os.environ, "NO_COLOR": "1", **(env or {})},
    )  # fmt: skip


def last_run(repo: Path) -> Path:
    runs = (p for p in (repo / ".clover" / "runs").iterdir() if p.is_dir())
    return sorted(runs, key=lambda p: p.stat().st_mtime)[-1]


def last_summary(repo: Path) -> dict:
    return json.loads((last_run(repo) / SUMMARY_FILE).read_text())


def start_seconds(repo: Path) -> float:
    """How long the last run's sandbox took to start (with the environment's set-up when it is not
    cached): from the set-up phase to the phase after it."""
    events = [json.loads(line) for line in (last_run(repo) / "trajectory.jsonl").read_text().splitlines()]
    phases = [e for e in events if e["type"] == "phase_started"]
    setup = next(n for n, e in enumerate(phases) if e["phase"] == "set-up")
    return phases[setup + 1]["time"] - phases[setup]["time"]


@pytest.mark.parametrize("project", PROJECTS, ids=[p.name for p in PROJECTS])
def test_fix_repairs_a_real_project_and_the_second_run_starts_from_the_cached_environment(
    project: Project, tmp_path: Path
) -> None:
    repo = fetch_sdist(project.name, project.version, tmp_path / "src")
    original = (repo / project.path).read_text()
    tag = environment_image(repo)
    drop_image(tag)  # made by an earlier run of this test: this one sets the project up itself
    starts: dict[str, float] = {}
    try:
        for attempt in ("cold", "warm"):
            inject(repo, project)
            # the second time as a user who does not know which test: whatever the bug breaks
            target = project.target if attempt == "cold" else "the failing test"
            proc = fix(repo, target, replay_file(tmp_path / f"{attempt}.jsonl", project))
            out = proc.stdout + proc.stderr
            assert proc.returncode == 0, out[-6000:]
            assert "FIXED" in proc.stdout
            if attempt == "cold":
                assert "sandbox: environment: setting the project up" in out, out[-3000:]
                # uv's pip interface, or pip when uv failed where pip may not (markupsafe 2.1.5)
                assert re.search(r"sandbox: environment: (uv )?pip install the project \(editable", out)
                assert "sandbox: environment: installer uv " in out, out[-3000:]
                for found in project.says:
                    assert found in out, out[-3000:]
            else:
                assert f"sandbox: environment: cached ({tag})" in out, out[-3000:]
                assert "setting the project up" not in out
                summary = last_summary(repo)
                assert summary["mode"] == "failing tests" and summary["verdict"] == "fixed"
                outcomes = summary["tests"]["suite_before"]["outcomes"]
                failing = [t for t, o in outcomes.items() if o in ("failed", "error")]
                assert summary["tests"]["target_before"]["failed"] == len(failing) >= 1
                if "::" in project.target:  # the test the bug is known to break, among those chosen
                    assert project.target in failing, failing
                said = f"the {len(failing)} test(s) failing in the suite ('the failing test' names the tests failing now)"
                assert said in proc.stdout, proc.stdout[-3000:]
            # the patch is applied: the file is as released again, and nothing else changed
            assert (repo / project.path).read_text() == original
            assert git(repo, "status", "--porcelain") == f" M {project.path}\n"
            summary = last_summary(repo)
            after = summary["tests"]["suite_after"]
            assert after["failed"] == 0 and after["errors"] == 0 and after["passed"] > 40, after
            assert summary["tests"]["target_before"]["failed"] >= 1
            starts[attempt] = start_seconds(repo)
        # the set-up is not repeated (bench/env_bench.py measures by how much)
        assert starts["warm"] < starts["cold"], starts
    finally:
        drop_image(tag)


def tree(root: Path) -> dict[str, bytes]:
    """The user's files (the run records under .clover/runs left out)."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".clover/runs" not in p.as_posix()
    }


def demo(
    root: Path,
    *,
    dependency: str = "text-unidecode==1.3",
    config: str = "",
    test_import: str = "text_unidecode",
) -> Path:
    return make_repo(
        root,
        {
            "pyproject.toml": f'[project]\nname = "demo-{root.name}"\nversion = "0.1"\ndependencies = ["{dependency}"]\n'
            '[tool.setuptools]\npy-modules = ["demo"]\n',
            "demo.py": "def add(a, b):\n    return a - b\n",
            "tests/test_demo.py": f"import {test_import}\nfrom demo import add\n\ndef test_add():\n    assert add(1, 2) == 3\n",
            **({".clover/config.toml": config} if config else {}),
        },
    )


def unused_replay(path: Path) -> Path:
    """A replay that would change the code and finish, were the agent started."""
    turn = (
        "<tool_call>\n<function=editor>\n<parameter=command>\ncreate\n</parameter>\n<parameter=path>\n"
        "/workspace/demo.py\n</parameter>\n<parameter=file_text>\nx = 1\n</parameter>\n</function>\n</tool_call>"
    )
    path.write_text(json.dumps({"content": turn}) + "\n")
    return path


def assert_stopped_before_the_agent(repo: Path, proc: subprocess.CompletedProcess[str], before: dict) -> str:
    assert proc.returncode == 4, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback (most recent call last)" not in proc.stderr
    assert tree(repo) == before  # nothing lost, nothing changed
    (run,) = (p for p in (repo / ".clover" / "runs").iterdir() if p.is_dir())
    events = [json.loads(line)["type"] for line in (run / "trajectory.jsonl").read_text().splitlines()]
    assert "run_started" not in events and "model_responded" not in events  # the agent never started
    assert events[-1] == "task_finished"
    return proc.stderr


def test_a_dependency_that_cannot_be_installed(tmp_path: Path) -> None:
    repo = demo(tmp_path / "nodep", dependency="clover-agent-no-such-package-xyz==1.0")
    before = tree(repo)
    err = assert_stopped_before_the_agent(
        repo, fix(repo, "tests/test_demo.py::test_add", unused_replay(tmp_path / "unused.jsonl")), before
    )
    assert "the environment set-up failed at step 1 of 1" in err
    assert "clover-agent-no-such-package-xyz" in err and "A requirement is not available" in err


def test_a_setup_command_that_fails(tmp_path: Path) -> None:
    command = "echo FIRST-$((6 * 7)); seq 1 40000; echo generating the parser; exit 3"
    repo = demo(tmp_path / "badsetup", config=f'[sandbox]\nsetup = ["{command}"]\n')
    before = tree(repo)
    err = assert_stopped_before_the_agent(
        repo, fix(repo, "tests/test_demo.py::test_add", unused_replay(tmp_path / "unused.jsonl")), before
    )
    assert f"run {command} (exit code 3)" in err and "generating the parser" in err
    # The message shows the tail; the whole output is kept in the run folder, and the message says where.
    (run,) = (p for p in (repo / ".clover" / "runs").iterdir() if p.is_dir())
    log = run / "environment-setup.log"
    assert f"the set-up's whole output: {log}" in err
    assert "FIRST-42" not in err
    kept = log.read_text()
    assert kept.startswith("$ ") and "FIRST-42\n1\n2\n" in kept and "\n40000\n" in kept


def test_a_collection_error_before_any_change(tmp_path: Path) -> None:
    repo = demo(tmp_path / "collect", test_import="yaml_not_installed_anywhere")
    before = tree(repo)
    try:
        err = assert_stopped_before_the_agent(
            repo, fix(repo, "tests/test_demo.py::test_add", unused_replay(tmp_path / "unused.jsonl")), before
        )
    finally:
        drop_image(environment_image(repo))
    assert (
        "cannot run in the sandbox's environment: the module 'yaml_not_installed_anywhere' is not installed"
        in err
    )
    assert "No module named 'yaml_not_installed_anywhere'" in err  # the output that shows it
    assert "To fix the set-up" in err and "the agent was not started" in err


def test_a_module_of_an_extra_the_set_up_did_not_install_is_named_with_the_line_to_add(
    tmp_path: Path,
) -> None:
    """pydantic-extra-types 2.9.0 with the extras chosen in .clover/config.toml (so the set-up adds
    none): its ULID tests need the extra python_ulid, and the message says which line installs it."""
    repo = fetch_sdist("pydantic-extra-types", "2.9.0", tmp_path / "src")
    (repo / ".clover").mkdir()
    (repo / ".clover" / "config.toml").write_text('[sandbox]\nextras = ["phonenumbers"]\n')
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "choose the extras")
    before = tree(repo)
    try:
        err = assert_stopped_before_the_agent(
            repo, fix(repo, "tests/test_ulid.py", unused_replay(tmp_path / "unused.jsonl")), before
        )
    finally:
        drop_image(environment_image(repo))
    assert "the module 'ulid' is not installed (No module named 'ulid')" in err, err[-3000:]
    assert "the project's extra 'python_ulid' lists python-ulid, which provides it" in err
    assert 'extras = ["phonenumbers", "python_ulid"]' in err


#: markupsafe 2.1.5: C speedups with a pure-Python fallback, and tests parametrized over both
#: implementations, the speedups' cases skipped where they are not built; tox.ini's test deps are
#: requirements/tests.txt (its dev.txt pins tox, Sphinx and more). The bug is in the fallback.
MARKUPSAFE = Project(
    "MarkupSafe", "2.1.5", "a C extension with a pure fallback, parametrized over both",
    "src/markupsafe/_native.py", '        .replace(">", "&gt;")\n', '        .replace(">", ">")\n',
    "tests/test_escape.py", "tests/test_escape.py",
)  # fmt: skip
#: What a sandbox's start says of its environment image, the tag in the brackets.
ENVIRONMENT = re.compile(r"environment: (?:setting the project up in a new environment|cached) \(([^,)\s]+)")


@pytest.mark.xdist_group("compiler-variant")  # the variant is built once, on one worker
def test_a_c_extension_with_a_fallback_its_skipped_cases_a_hanging_test_then_the_compiler_variant(
    tmp_path: Path,
) -> None:
    """markupsafe 2.1.5 with a test that hangs committed beside the bug, and a host pip setting the
    sandbox does not carry (``PIP_CONSTRAINT``). By default there is no compiler: the speedups fall
    back, so the target's speedups cases are skipped before and after (listed, not a failure), the
    hang fails alone at its per-test limit, and the fix is ``fixed``. Then with ``compiler = true``
    the set-up builds the speedups, and their cases run and pass."""
    project = MARKUPSAFE
    repo = fetch_sdist(project.name, project.version, tmp_path / "src")
    original = (repo / project.path).read_text()
    (repo / ".clover").mkdir()
    (repo / ".clover" / "config.toml").write_text("[fix]\ntest_timeout = 5\n")
    (repo / "tests" / "test_hangs.py").write_text(
        "import time\n\n\ndef test_waits_for_a_server_that_never_answers():\n    time.sleep(3600)\n"
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a test that hangs, and each test's limit")
    inject(repo, project)
    drop_image(environment_image(repo))  # made by an earlier run of this test: this one sets it up
    made: list[str] = []
    try:
        constraints = tmp_path / "constraints.txt"
        constraints.write_text("markupsafe<3\n")
        proc = fix(repo, project.target, replay_file(tmp_path / "plain.jsonl", project),
                   env={"PIP_CONSTRAINT": str(constraints)})  # fmt: skip
        out = proc.stdout + proc.stderr
        made += ENVIRONMENT.findall(out)
        assert proc.returncode == 0, out[-6000:]
        assert "FIXED" in proc.stdout
        # the test deps as tox has them, every package named; the host setting left out, named
        assert "requirements/tests.txt" in out and "requirements/dev.txt" not in out, out[-4000:]
        assert "the variables PIP_CONSTRAINT: not carried into the sandbox's set-up, left out" in out
        assert "compiler:" not in out
        summary = last_summary(repo)
        assert summary["verdict"] == "fixed"
        skipped = summary["target_skipped"]
        assert skipped and all(t.startswith(f"{project.target}::") for t in skipped), skipped
        before = summary["tests"]["target_before"]["outcomes"]
        assert {before[t] for t in skipped} == {"skipped"} and "failed" in before.values()
        assert "target tests skipped before and after: not checked" in proc.stdout
        hang = "tests/test_hangs.py::test_waits_for_a_server_that_never_answers"
        assert summary["still_failing"] == [hang]  # alone, at its limit, before and after
        assert summary["tests"]["suite_after"]["outcomes"][hang] == "failed"
        assert (repo / project.path).read_text() == original
        assert git(repo, "status", "--porcelain") == f" M {project.path}\n"

        # the same bug, the hang gone, the compiler variant asked for by the repository's file
        git(repo, "checkout", "-q", "--", project.path)
        git(repo, "rm", "-q", "tests/test_hangs.py")
        (repo / ".clover" / "config.toml").write_text("[sandbox]\ncompiler = true\n")
        git(repo, "commit", "-q", "-am", "the compiler variant")
        proc = fix(repo, project.target, replay_file(tmp_path / "compiled.jsonl", project))
        out = proc.stdout + proc.stderr
        made += ENVIRONMENT.findall(out)
        assert proc.returncode == 0, out[-6000:]
        assert "sandbox: compiler: " in out, out[-4000:]
        summary = last_summary(repo)
        assert summary["verdict"] == "fixed" and summary["target_skipped"] == []
        after = summary["tests"]["target_after"]["outcomes"]
        assert set(after.values()) == {"passed"} and len(after) == len(before)  # the speedups' cases ran
        assert (repo / project.path).read_text() == original
    finally:
        for tag in made:
            drop_image(tag)


MARKUPSAFE_3 = Project(
    "MarkupSafe", "3.0.2", "a C extension whose build fails without a compiler, after which its own "
    "fallback breaks the editable install: the compiler variant, taken by itself",
    "src/markupsafe/_native.py", '        .replace(">", "&gt;")\n', '        .replace(">", ">")\n',
    "tests/test_escape.py", "tests/test_escape.py",
)  # fmt: skip
#: What a set-up that needed a compiler says, then the next start (the tag in the brackets).
IN_THE_VARIANT = (
    "sandbox: environment: an extension could not be built without a compiler; setting up once more"
)
CACHED_IN_THE_VARIANT = re.compile(
    r"environment: cached, in the compiler variant \(its set-up builds an extension: (\S+)\)"
)


@pytest.mark.xdist_group("compiler-variant")  # the variant is built once, on one worker
def test_a_native_build_that_fails_takes_the_compiler_variant_by_itself(tmp_path: Path) -> None:
    """markupsafe 3.0.2 with the defaults (no `--with-compiler`): the plain set-up fails building its
    speedups and its fallback then breaks the editable install; the set-up is made once more in the
    compiler variant by itself, the bug is fixed with no new failure (its conftest's autouse
    fixture with ``params`` runs the canaries as plain functions), and the next run starts from that
    environment, cached."""
    project = MARKUPSAFE_3
    repo = fetch_sdist(project.name, project.version, tmp_path / "src")
    made: list[str] = []
    try:
        for attempt in ("cold", "warm"):
            inject(repo, project)
            proc = fix(repo, project.target, replay_file(tmp_path / f"{attempt}.jsonl", project))
            out = proc.stdout + proc.stderr
            made += ENVIRONMENT.findall(out) + CACHED_IN_THE_VARIANT.findall(out)
            assert proc.returncode == 0, out[-6000:]
            assert "FIXED" in proc.stdout
            if attempt == "cold":
                assert IN_THE_VARIANT in out, out[-4000:]
            else:
                assert CACHED_IN_THE_VARIANT.search(out) and "setting the project up" not in out, out[-4000:]
            summary = last_summary(repo)
            assert summary["verdict"] == "fixed" and summary["regressions"] == [] and summary["review"] == []
            assert summary["target_skipped"] == []  # the speedups' cases ran: the extension was built
            assert git(repo, "status", "--porcelain") == f" M {project.path}\n"
    finally:
        for tag in made:
            drop_image(tag)


#: pydantic-extra-types 2.9.0: its tests import pycountry, pendulum, phonenumbers, semver and ulid,
#: directly or through its own modules, each the package of one of its extras, and its test
#: requirements (requirements/testing.txt) list none of them.
PYDANTIC_EXTRA_TYPES = Project(
    "pydantic-extra-types", "2.9.0", "the packages of five extras imported by its tests",
    "pydantic_extra_types/ulid.py", "                ulid = _ULID.from_int(value)\n",
    "                ulid = _ULID.from_int(value + 1)\n", "tests/test_ulid.py", "tests/test_ulid.py",
)  # fmt: skip


def test_the_extras_a_real_projects_tests_import_are_installed_by_default(tmp_path: Path) -> None:
    """pydantic-extra-types 2.9.0 with the defaults: without those extras most of its test modules
    fail to collect; the set-up installs them, names every package, and names the pip setting of
    this machine that it does not carry (one is added here). Its tests of three extras pass (the
    others' newest releases warn in ways its ``filterwarnings = error`` does not take: they fail
    before and after, listed), and the bug in the ULID type is fixed."""
    project = PYDANTIC_EXTRA_TYPES
    repo = fetch_sdist(project.name, project.version, tmp_path / "src")
    inject(repo, project)
    tag = environment_image(repo)
    drop_image(tag)
    conf = tmp_path / "pip.conf"
    conf.write_text("[install]\nprefer-binary = true\n")
    try:
        proc = fix(repo, project.target, replay_file(tmp_path / "replay.jsonl", project),
                   env={"PIP_CONFIG_FILE": str(conf)})  # fmt: skip
    finally:
        drop_image(tag)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "its extra phonenumbers: the tests import phonenumbers (phonenumbers)" in out, out[-6000:]
    assert "its extra python_ulid: the tests import ulid (python-ulid)" in out
    assert (
        "environment: uv pip install the project (editable, extras pycountry, pendulum, python_ulid, semver, "
        "phonenumbers), requirements/testing.txt, pytest (1/1)" in out
    )
    assert (
        f"environment: pip's prefer-binary (in {conf}): not carried into the sandbox's set-up, left out"
        in out
    )
    summary = last_summary(repo)
    assert summary["verdict"] == "fixed" and summary["regressions"] == []
    before = summary["tests"]["suite_before"]["outcomes"]
    for module in ("tests/test_phone_numbers.py", "tests/test_ulid.py", "tests/test_country_code.py"):
        ran = {o for t, o in before.items() if t.startswith(module + "::")}
        assert ran and (module == project.target or ran == {"passed"}), (module, ran)
    assert summary["tests"]["suite_before"]["errors"] == 0  # every module collected (13,000 tests)
    assert git(repo, "status", "--porcelain") == f" M {project.path}\n"


#: python-utils 3.8.2: ``--cov python_utils`` in pytest.ini's addopts (pytest-cov is in its tests
#: extra), so every test run writes ``.coverage`` beside the code.
PYTHON_UTILS = Project(
    "python-utils", "3.8.2", "coverage data written by every test run",
    "python_utils/generators.py", "        if len(batch) == batch_size:\n",
    "        if len(batch) > batch_size:\n", "_python_utils_tests/test_generators.py::test_batcher",
    "_python_utils_tests/test_generators.py",
)  # fmt: skip
#: Its async batching tests time batches to 20 ms, and test_time.py's 11 tests time generators to
#: 10 ms, which a loaded machine misses: skipped in the commit before the bug (a flaky test is not
#: what the test below is about; the verdict rightly says "suite unverified" when one flakes).
TIMED_TESTS = ("test_abatcher_timed", "test_abatcher_timed_with_timeout")
TIMED_MODULE = "_python_utils_tests/test_time.py"


def test_the_coverage_data_a_real_projects_test_runs_write_is_left_out_of_the_patch_and_named(
    tmp_path: Path,
) -> None:
    project = PYTHON_UTILS
    repo = fetch_sdist(project.name, project.version, tmp_path / "src")
    tests = repo / "_python_utils_tests" / "test_generators.py"
    text = tests.read_text()
    for name in TIMED_TESTS:
        assert text.count(f"async def {name}(") == 1
        text = text.replace(
            f"async def {name}(", f"@pytest.mark.skip(reason='timed to 20 ms')\nasync def {name}("
        )
    tests.write_text(text)
    timed = repo / TIMED_MODULE
    text = timed.read_text()
    assert text.count("\nimport pytest\n") == 1
    timed.write_text(
        text.replace(
            "\nimport pytest\n", "\nimport pytest\n\npytestmark = pytest.mark.skip(reason='timed to 10 ms')\n"
        )
    )
    git(repo, "commit", "-q", "-am", "skip the timed tests")
    inject(repo, project)
    tag = environment_image(repo)
    drop_image(tag)
    try:
        proc = fix(repo, project.target, replay_file(tmp_path / "replay.jsonl", project))
    finally:
        drop_image(tag)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "FIXED" in proc.stdout
    summary = last_summary(repo)
    assert summary["verdict"] == "fixed" and summary["files_changed"] == [project.path]
    assert summary["left_out"][".coverage"].startswith("coverage data, written by test runs"), summary[
        "left_out"
    ]
    assert "left out    .coverage: coverage data, written by test runs, not part of the change" in proc.stdout
    after = summary["tests"]["suite_after"]
    assert after["failed"] == 0 and after["errors"] == 0 and after["passed"] > 40, after
    assert git(repo, "status", "--porcelain") == f" M {project.path}\n"
    assert not (repo / ".coverage").exists()


#: python-dateutil 2.9.0.post0: setuptools-scm<8 (it reads only the plain pretend variable; with a
#: wrong version its freezegun requirement walked pip back for minutes), and a suite written for
#: the pytest of its time under `filterwarnings = error` (pytest 9's notice about its generator
#: parametrize failed test_isoparser's collection, leaving the suite unverified).
DATEUTIL = Project(
    "python-dateutil", "2.9.0.post0", "an old setuptools-scm and a strict suite of an older pytest's time",
    "src/dateutil/easter.py", "            e = 10\n", "            e = 11\n",
    "tests/test_easter.py", "tests/test_easter.py",
)  # fmt: skip


def test_an_old_setuptools_scm_project_with_a_strict_suite_is_fixed_with_its_whole_suite_checked(
    tmp_path: Path,
) -> None:
    """python-dateutil 2.9.0.post0 with the defaults: its version is its own, its requirements
    resolve, every test module collects, and the bug in Orthodox Easter is `fixed` with no new
    failure and nothing to review."""
    project = DATEUTIL
    repo = fetch_sdist(project.name, project.version, tmp_path / "src")
    tag = environment_image(repo)
    drop_image(tag)
    try:
        inject(repo, project)
        proc = fix(repo, project.target, replay_file(tmp_path / "dateutil.jsonl", project))
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-6000:]
        assert "FIXED" in proc.stdout
        assert "check that the installed python-dateutil says version 2.9.0.post0" in out, out[-3000:]
        summary = last_summary(repo)
        assert summary["verdict"] == "fixed" and summary["regressions"] == [] and summary["review"] == []
        before, after = summary["tests"]["suite_before"], summary["tests"]["suite_after"]
        assert before["errors"] == 0 and after["errors"] == 0 and after["failed"] == 0, after
        assert after["passed"] > 1500, after
        assert git(repo, "status", "--porcelain") == f" M {project.path}\n"
    finally:
        drop_image(tag)
