"""SWE-bench's own environments: an instance runs in its instance image, with the image name, eval
script, test command and log parser of the ``swebench`` package (4.x, pinned: its
``make_test_spec`` reads ``MAP_REPO_VERSION_TO_SPECS``), and is graded by that package's grading
code over the eval script's log. Nothing here re-derives what the package says.

The instance image is pulled from a namespace, or taken from the local Docker engine under
swebench's name and, where missing, built by swebench's own ``prepare_images``.
The sandbox runs a variant of it (``sandboxes/images/swebench.Dockerfile``) where ``/testbed`` is
the workspace. The grade cross-checks the log with a guarded run (pytest instances): code under
test can print a fake ``PASSED`` line into a log, not into that run's signed channel.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clover_agent.errors import UsageError
from clover_agent.eval.grade import GRADE_TIMEOUT_S, Grade, outcomes_of, prepare_tree
from clover_agent.eval.scripts import parse_patch
from clover_agent.eval.swebench_grade import open_file_limit
from clover_agent.eval.tasks import Task
from clover_agent.handback.hostgit import git
from clover_agent.launch import sandbox_spec
from clover_agent.sandboxes.base import SandboxSpec
from clover_agent.sandboxes.errors import SandboxUnavailable
from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.settings import RepoSettings, Settings
from clover_agent.tools.run_tests import run_tests_in

if TYPE_CHECKING:
    import docker

TESTBED = "/testbed"
#: The instance's conda environment (swebench's images); first on the agent's PATH.
TESTBED_PATH = "/opt/miniconda3/envs/testbed/bin:/opt/miniconda3/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
EVAL_SCRIPT = "/tmp/clover-swebench-eval.sh"
#: Files of the test infrastructure a model's patch may not change at grading time, beside the
#: test patch's own files: pytest's configuration files, conftests, django's and sympy's runners.
INFRASTRUCTURE_NAMES = ("conftest.py", "pytest.ini", ".pytest.ini", "tox.ini")
INFRASTRUCTURE_PATHS = ("tests/runtests.py", "bin/test")


def swebench_package() -> Any:
    """The ``swebench`` package, or a usage error that says how to get it."""
    try:
        import swebench
        import swebench.harness.grading
        import swebench.harness.test_spec.test_spec
    except ImportError as exc:
        raise UsageError(
            f"SWE-bench instances need the swebench package, which is not importable here ({exc}): "
            "`pip install 'clover-agent[swebench]'` (swebench 4.1.0)"
        ) from None
    return swebench


def is_instance(task: Task) -> bool:
    """A SWE-bench line: an ``owner/name`` repo with a ``base_commit`` and a ``version``."""
    return all(task.swebench.get(key) for key in ("repo", "base_commit", "version"))


def has_spec(task: Task) -> bool:
    """``task`` is a SWE-bench instance the installed swebench has a spec for (False without it)."""
    if not is_instance(task):
        return False
    try:
        from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS
    except ImportError:
        return False
    return task.swebench["version"] in MAP_REPO_VERSION_TO_SPECS.get(task.swebench["repo"], {})


def instance_spec(task: Task, namespace: str | None = None) -> Any:
    """swebench's ``TestSpec`` of the task (its image names, eval script, test command)."""
    swebench_package()
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS
    from swebench.harness.test_spec.test_spec import make_test_spec

    repo, version = task.swebench.get("repo", ""), task.swebench.get("version", "")
    if version not in MAP_REPO_VERSION_TO_SPECS.get(repo, {}):
        raise UsageError(
            f"{task.origin}: swebench {_version()} has no spec for {repo} version {version!r} "
            "(its MAP_REPO_VERSION_TO_SPECS): the instance's image and test command are unknown"
        )
    try:
        return make_test_spec(task.to_instance(), namespace=namespace)
    except (OSError, ValueError) as exc:  # requests' errors are OSErrors; a file it could not find
        raise SandboxUnavailable(
            f"swebench's make_test_spec for {repo} {version} failed: {type(exc).__name__}: {exc} (for most "
            "repositories it reads the requirements or environment file from GitHub, "
            "raw.githubusercontent.com, which must be reachable)"
        ) from None


def _version() -> str:
    from importlib.metadata import version

    return version("swebench")


def instance_test_command(spec: Any) -> str:
    """The instance's own test command (its spec's ``test_cmd`` and the test patch's files), as
    the eval script runs it."""
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS
    from swebench.harness.test_spec.python import get_test_directives

    command = MAP_REPO_VERSION_TO_SPECS[spec.repo][spec.version]["test_cmd"]
    command = command[-1] if isinstance(command, list) else command
    instance = {"repo": spec.repo, "test_patch": _test_patch_of(spec)}
    return " ".join([command, *get_test_directives(instance)])


def _test_patch_of(spec: Any) -> str:
    """The test patch, as the eval script holds it (between its heredoc's delimiters)."""
    for line in spec.eval_script_list:
        if line.startswith("git apply -v - <<'"):
            delimiter = line.split("'")[1]
            return line.split("\n", 1)[1].rsplit(f"\n{delimiter}", 1)[0]
    return ""


@dataclass
class InstanceImages:
    """Where instance images come from: ``namespace`` None: the local engine only; else pulled
    from that namespace when missing (swebench's remote names)."""

    namespace: str | None = None
    progress: Any = field(default=lambda text: None)


def instance_image(
    client: docker.DockerClient, spec: Any, images: InstanceImages, task: Task, folder: Path
) -> str:
    """The instance image's name, on the engine: pulled first when a namespace is given, else
    built by swebench's own builder (``prepare_images``, run in ``folder``) when missing."""
    from docker.errors import APIError, ImageNotFound

    name = str(spec.instance_image_key)
    try:
        client.images.get(name)
        return name
    except ImageNotFound:
        pass
    if images.namespace is None:
        images.progress(
            f"{name} is not here: building it with swebench's prepare_images (it needs the internet)"
        )
        why = build_with_swebench(task, folder)
        try:
            client.images.get(name)
            return name
        except ImageNotFound:
            raise SandboxUnavailable(
                f"the SWE-bench instance image {name} is not on this Docker engine, and swebench's "
                f"prepare_images could not build it (it needs the internet: Docker Hub's base image, conda, "
                f"GitHub): {why}; or pull it with --swebench-namespace swebench"
            ) from None
    images.progress(f"pulling {name}")
    try:
        client.images.pull(name)
    except APIError as exc:
        raise SandboxUnavailable(f"cannot pull the SWE-bench instance image {name}: {exc}") from None
    return name


#: How much of prepare_images' output an error quotes.
BUILD_LOG_TAIL = 600


def build_with_swebench(task: Task, folder: Path) -> str:
    """Runs ``python -m swebench.harness.prepare_images`` for ``task`` in ``folder`` (its logs go
    there); returns the tail of its output and where the whole of it is."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dataset.jsonl").write_text(json.dumps(task.to_instance()) + "\n", encoding="utf-8")
    command = [
        sys.executable, "-m", "swebench.harness.prepare_images",
        "--dataset_name", str((folder / "dataset.jsonl").resolve()),
        "--instance_ids", task.instance_id,
        "--max_workers", "1",
        "--open_file_limit", str(open_file_limit()),
        "--namespace", "none",
        "--tag", "latest",
        "--env_image_tag", "latest",
    ]  # fmt: skip
    log = folder / "prepare_images.log"
    with open(log, "wb") as out:
        proc = subprocess.run(command, cwd=folder, stdout=out, stderr=subprocess.STDOUT, check=False)
    tail = " ".join(log.read_text(encoding="utf-8", errors="replace").split())[-BUILD_LOG_TAIL:]
    return f"it exited {proc.returncode}, its output ends: ...{tail} (all of it: {log})"


def export_testbed(client: docker.DockerClient, image: str, dest: Path, base_commit: str) -> None:
    """``dest``: the image's ``/testbed`` (the repository at its base commit, with its history),
    read from a container that never starts; the base commit must be there."""
    scratch = dest.with_name(dest.name + ".export")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    container = client.containers.create(image, command=["true"], network_disabled=True)
    try:
        stream, _ = container.get_archive(TESTBED)
        with open(scratch / "testbed.tar", "wb") as tar:  # a large repository's history: not in memory
            for chunk in stream:
                tar.write(chunk)
    finally:
        container.remove(force=True)
    with tarfile.open(scratch / "testbed.tar") as archive:
        archive.extractall(scratch, filter="data")  # no links out, no devices, no owners
    shutil.rmtree(dest, ignore_errors=True)
    (scratch / Path(TESTBED).name).rename(dest)
    shutil.rmtree(scratch, ignore_errors=True)
    found = git(dest, "cat-file", "-e", f"{base_commit}^{{commit}}", check=False)
    if found.returncode != 0:
        raise SandboxUnavailable(
            f"{image}: {TESTBED} has no commit {base_commit} (the instance's base_commit)"
        )


def infrastructure_paths(task: Task, patch: str) -> list[str]:
    """The files ``patch`` touches that the grade takes as the task has them: the test patch's
    files and the test infrastructure (:data:`INFRASTRUCTURE_NAMES`, :data:`INFRASTRUCTURE_PATHS`)."""
    held = {name for d in parse_patch(task.test_patch) for name in (d.old, d.new) if name}
    touched = {name for d in parse_patch(patch) for name in (d.old, d.new) if name}
    return sorted(
        p for p in touched if p in held or Path(p).name in INFRASTRUCTURE_NAMES or p in INFRASTRUCTURE_PATHS
    )


def log_tampering(log: str) -> str:
    """Why the eval script's log cannot be read as its tests' output ("" when it can): the
    markers swebench cuts it at appear once each, in the shell's trace, unless something else
    (the code under test) wrote them."""
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

    for marker in (START_TEST_OUTPUT, END_TEST_OUTPUT):
        if not log.count(marker):
            return f"the test log lacks {marker!r}: the tests did not run, or their output was cut"
        if log.count(marker) > 1:
            return (
                f"the test log holds {marker!r} {log.count(marker)} times, not once: "
                "written by the patch or the code under test"
            )
    return ""


def swebench_report(spec: Any, task: Task, patch: str, log_path: Path) -> dict[str, Any]:
    """swebench's own report of the instance over ``log_path`` (``get_eval_report``)."""
    from swebench.harness.grading import get_eval_report

    prediction = {"instance_id": task.instance_id, "model_name_or_path": "clover-agent", "model_patch": patch}
    report = get_eval_report(spec, prediction, str(log_path), include_tests_status=True)
    return dict(report[task.instance_id])


def installs_a_copy(spec: Any) -> bool:
    """The instance's spec installs the project as a copy (``pip install .``, not ``-e``)."""
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS

    install = str(MAP_REPO_VERSION_TO_SPECS[spec.repo][spec.version].get("install", "")).split()
    return "pip" in install and "install" in install and "-e" not in install and "--editable" not in install


@dataclass(frozen=True)
class InstanceEnvironment:
    """An instance ready to run: swebench's test spec and the sandbox variant of its image."""

    spec: Any
    sandbox_image: str

    def sandbox_spec(self, settings: Settings, tree: Path) -> SandboxSpec:
        """The sandbox over ``tree``: the variant image as it is (no environment of ours), the
        instance's environment first on the PATH."""
        return sandbox_spec(
            settings, tree, image=self.sandbox_image, env={"PATH": TESTBED_PATH}, repo_config=RepoSettings()
        )


def open_instance(task: Task, images: InstanceImages, settings: Settings, base: Path) -> InstanceEnvironment:
    """swebench's spec of ``task``, its instance image (pulled when asked) and the image's sandbox
    variant; ``base`` made from the image's ``/testbed`` unless it is there."""
    from clover_agent.sandboxes.docker import docker_client
    from clover_agent.sandboxes.images import swebench_image

    spec = instance_spec(task, images.namespace)
    client = docker_client(settings.environment)
    image = instance_image(client, spec, images, task, base.with_name("images"))
    variant = swebench_image(client, image, editable=installs_a_copy(spec), progress=images.progress)
    if not (base / ".git").is_dir():
        export_testbed(client, image, base, task.swebench["base_commit"])
    return InstanceEnvironment(spec, variant)


async def grade_instance(
    task: Task,
    spec: Any,
    base: Path,
    work: Path,
    model_patch: str,
    make_spec: Callable[[Path], SandboxSpec],
    kind: str,
) -> Grade:
    """Grade ``model_patch`` in the instance's sandbox: the patch (less the files of
    :func:`infrastructure_paths`) over the base tree, swebench's eval script run there and its log
    graded by swebench; for pytest instances a guarded run of FAIL_TO_PASS and PASS_TO_PASS
    must agree with the log. ``work/../test_output.txt`` keeps the log."""
    from clover_agent.errors import RUN_ERRORS, message_of

    dropped = infrastructure_paths(task, model_patch)
    problem = prepare_tree(base, work, task, model_patch, exclude=dropped)
    details: dict[str, Any] = {"left_out": dropped, "test_command": instance_test_command(spec)}
    if problem is not None:
        return Grade(False, f"the patch does not apply: {problem}", patch_applied=False, details=details)
    log_path = work.with_name("test_output.txt")
    try:
        async with create_sandbox(kind, make_spec(work)) as sandbox:
            checked = None if task.unrunnable else await _guarded_outcomes(sandbox, task)
            encoded = base64.b64encode(spec.eval_script.encode()).decode()
            ran = await sandbox.exec(
                f"echo {encoded} | base64 -d > {EVAL_SCRIPT} && bash {EVAL_SCRIPT}", timeout=GRADE_TIMEOUT_S
            )
    except RUN_ERRORS as exc:
        return Grade(False, f"the grading sandbox failed: {message_of(exc)}", details=details)
    log_path.write_text(ran.output, encoding="utf-8", errors="surrogateescape")
    report = swebench_report(spec, task, model_patch, log_path)
    details |= {"swebench": report, "log": str(log_path), "timed_out": ran.timed_out}
    status = report.get("tests_status") or {}
    f2p = {t: "passed" for t in status.get("FAIL_TO_PASS", {}).get("success", [])}
    f2p |= {t: "failed" for t in status.get("FAIL_TO_PASS", {}).get("failure", [])}
    p2p_failed = list(status.get("PASS_TO_PASS", {}).get("failure", []))
    why_not = _why_not(report, log_tampering(ran.output), checked, ran.timed_out)
    if why_not:
        return Grade(False, why_not, f2p, p2p_failed, details=details)
    how = "and the guarded run agrees" if checked is not None else "(the log alone: not pytest ids)"
    return Grade(
        True, f"resolved: swebench's grading of the test log {how}", f2p, p2p_failed, details=details
    )


def _why_not(
    report: dict[str, Any], tampered: str, checked: dict[str, list[str]] | None, timed_out: bool
) -> str:
    """Why the instance is not resolved, first reason first ("" when it is)."""
    if timed_out:
        return f"the eval script ran past {GRADE_TIMEOUT_S:.0f}s"
    if tampered:
        return tampered
    if not report.get("patch_successfully_applied"):
        return "swebench could not read the test log (the test patch did not apply, or the tests did not run)"
    if checked is not None and (checked["fail"] or checked["broken"]):
        said = "resolved" if report.get("resolved") else "unresolved"
        return (
            f"the guarded run (its signed results channel, which printing cannot forge) does not confirm "
            f"the log (swebench: {said}): "
            f"FAIL_TO_PASS not passing {checked['fail'][:5]}, PASS_TO_PASS broken {checked['broken'][:5]}"
        )
    if not report.get("resolved"):
        status = report.get("tests_status") or {}
        failing = [
            f"{kind}: {name}"
            for kind in ("FAIL_TO_PASS", "PASS_TO_PASS")
            for name in status.get(kind, {}).get("failure", [])
        ]
        return "unresolved (swebench): " + ("; ".join(failing[:5]) or "see the log")
    return ""


async def _guarded_outcomes(sandbox: Any, task: Task) -> dict[str, list[str]]:
    """FAIL_TO_PASS not passing and PASS_TO_PASS broken, from guarded pytest runs."""
    target = await run_tests_in(sandbox, " ".join(task.fail_to_pass), timeout=GRADE_TIMEOUT_S, guarded=True)
    fail = [
        t
        for t in task.fail_to_pass
        if not (seen := outcomes_of(target, t)) or any(o != "passed" for o in seen)
    ]
    broken: list[str] = []
    if task.pass_to_pass:
        rest = await run_tests_in(sandbox, " ".join(task.pass_to_pass), timeout=GRADE_TIMEOUT_S, guarded=True)
        broken = [
            t
            for t in task.pass_to_pass
            if not (seen := outcomes_of(rest, t)) or any(o in ("failed", "error") for o in seen)
        ]
    return {"fail": fail, "broken": broken}
