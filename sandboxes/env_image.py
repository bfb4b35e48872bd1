"""Environment images: a project's set-up done once in a set-up container and kept as a local image.

The Docker sandbox (:mod:`clover_agent.sandboxes.docker`) asks for the image of a recipe
(:class:`~clover_agent.environments.recipe.EnvironmentRecipe`): the tag
``clover-agent-env:<key>``, the key hashing everything the environment depends on, so a stale
environment is never used. When the tag is missing a set-up container runs :func:`run_setup` and
is committed under it; ``clover-agent sandbox prune`` removes the images newer ones replaced
(:func:`superseded_environment_images`). Its inputs are in a volume at
:data:`~clover_agent.environments.recipe.SETUP_DIR`, never part of the image. No registry is
involved (environments/README.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import logging
import re
import tarfile
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clover_agent.environments.recipe import (
    CA_PATH,
    SANDBOX_ENVIRONMENT,
    VENV,
    WHEELS_PATH,
    WORKSPACE_OVERLAY,
    EnvironmentRecipe,
)
from clover_agent.sandboxes.base import ExecResult, Sandbox
from clover_agent.sandboxes.errors import SandboxSetupError
from clover_agent.sandboxes.images import COMPILER_PACKAGES

if TYPE_CHECKING:
    import docker

log = logging.getLogger(__name__)

ENV_REPOSITORY = "clover-agent-env"
LABEL_ENV = "clover-agent.env"
LABEL_ENV_BASE = "clover-agent.env.base"  # the id of the image it was made from
LABEL_ENV_REPO = "clover-agent.env.repo"  # the repository it was first made for
LABEL_ENV_CREATED = "clover-agent.env.created"  # seconds since the epoch
#: How often a running set-up step reports what it is doing.
PROGRESS_EVERY_S = 3.0
#: The running step's output, and the time the steps started (the volume at SETUP_DIR is root's).
_LOG = "/tmp/clover-setup-step.log"
_STARTED = "/tmp/clover-setup-started"
#: With uv, the virtual environment is made by uv (``python3 -m venv`` spends seconds running pip
#: to install pip) and seeded, offline, with the wheels Debian's ensurepip installs from
#: (``/usr/share/python-wheels``: the same pip and setuptools); without them ensurepip seeds it.
_UV_VENV = (
    f'UV_PYTHON_DOWNLOADS=never uv venv --quiet --python "$(command -v python3)" {VENV} && {{ '
    "seed=$(ls /usr/share/python-wheels/pip-*.whl /usr/share/python-wheels/setuptools-*.whl 2>/dev/null); "
    f'if [ -n "$seed" ]; then uv pip install --quiet --python {VENV}/bin/python --no-index $seed; '
    f"else {VENV}/bin/python -m ensurepip --default-pip; fi; }}"
)
#: The output a failure message shows of the failing step (its tail: pip says why at the end).
FAILURE_OUTPUT_CHARS = 3000

Progress = Callable[[str], None]


def environment_tag(recipe: EnvironmentRecipe, base_image_id: str) -> str:
    return f"{ENV_REPOSITORY}:{recipe.cache_key(base_image_id)[:24]}"


def setup_inputs_tar(recipe: EnvironmentRecipe, *, uid: int, gid: int) -> io.BytesIO:
    """A tar of the set-up's inputs for :data:`SETUP_DIR`: ``pip.conf``, the recipe's files, the CA
    bundle and the wheel folder's files, readable by ``uid``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.gid, info.mtime = len(data), 0o644, uid, gid, time.time()
            tar.addfile(info, io.BytesIO(data))

        add("pip.conf", recipe.pip_conf().encode())
        for name, text in recipe.files:
            add(name, text.encode())
        if recipe.network and recipe.index.ca_bundle:
            add(Path(CA_PATH).name, recipe.index.ca_bundle)
        if recipe.wheels:
            folder = Path(recipe.wheels)
            for name, _size in recipe.wheel_files:
                add(f"{Path(WHEELS_PATH).name}/{name}", (folder / name).read_bytes())
    buffer.seek(0)
    return buffer


async def run_setup(
    sandbox: Sandbox, recipe: EnvironmentRecipe, progress: Progress, *, compiler: bool = False
) -> None:
    """Make the environment in a started set-up container: the virtual environment, then each
    step; then keep the files the steps made in ``/workspace`` (:data:`WORKSPACE_OVERLAY`).

    Raises :class:`SandboxSetupError` naming the step, with its output's tail, when one fails
    (``compiler``: the container is the compiler variant, which changes the advice).
    """
    started = time.monotonic()
    for line in recipe.found:
        progress(f"environment: {line}")
    for note in recipe.index.notes if recipe.network else ():
        progress(f"environment: {note}")
    recipe = await _installer(sandbox, recipe, recipe.setup_env(), progress)
    env = recipe.setup_env()
    home = VENV.rsplit("/", 1)[0]
    make = _UV_VENV if recipe.installer == "uv" else f"python3 -m venv {VENV}"
    check = await sandbox.exec(
        f"touch {_STARTED} && if [ ! -w {home} ]; then echo '{home} is missing or not writable'; exit 3; fi; "
        f"{make}",
        timeout=300,
        env=env,
    )
    if check.exit_code != 0:
        raise SandboxSetupError(
            f"the sandbox image cannot hold a project environment (`{make}` in "
            f"{home} failed: {_tail(check.output, 600)}): it was built by an older clover-agent. "
            "Rebuild it with `clover-agent sandbox build` (the base needs python3-venv and the image "
            f'a {home} owned by uid 1000), or turn the environment off with `environment = "none"` '
            "in .clover/config.toml's [sandbox] table"
        )
    for number, step in enumerate(recipe.steps, 1):
        progress(f"environment: {step.title} ({number}/{len(recipe.steps)})")
        result = await _run_step(sandbox, step.command, recipe.timeout, env, progress)
        timed_out = (result.killed_reason or "").startswith("timeout")
        if (
            result.exit_code != 0
            and step.with_pip is not None
            and _pip_may_do_better(result.output, timed_out)
        ):
            why = decisive_lines(result.output, limit=1) or _tail(result.output, 200)
            progress(f"environment: uv failed at this step ({why}); pip, the fallback, tries it")
            first = f"(uv first: $ {step.command}\n{_tail(result.output, FAILURE_OUTPUT_CHARS // 3)})\n"
            step = step.with_pip
            progress(f"environment: {step.title} ({number}/{len(recipe.steps)})")
            result = await _run_step(sandbox, step.command, recipe.timeout, env, progress)
            if result.exit_code != 0:
                result = dataclasses.replace(result, output=f"{first}{result.output}")
        if result.exit_code != 0:
            status = result.killed_reason or f"exit code {result.exit_code}"
            decisive = decisive_lines(result.output)
            shown = f"what decided it:\n{decisive}\n" if decisive else ""
            timed_out = (result.killed_reason or "").startswith("timeout")
            raise SandboxSetupError(
                f"the environment set-up failed at step {number} of {len(recipe.steps)}, "
                f"{step.title} ({status}):\n$ {step.command}\n{shown}{_tail(result.output, FAILURE_OUTPUT_CHARS)}\n"
                f"{advice(recipe, result.output, compiler=compiler, timed_out=timed_out)}",
                native_build=not compiler and _needs_a_compiler(result.output.lower()),
                log=f"$ {step.command}\n{result.output}",
            )
    overlay = await sandbox.exec(
        f"cd /workspace && find . -path ./.git -prune -o -newer {_STARTED} \\( -type f -o -type l \\) "
        f"-print0 | tar --null --no-recursion -T - -cf {WORKSPACE_OVERLAY}",
        timeout=300,
    )
    if overlay.exit_code != 0:
        raise SandboxSetupError(f"could not keep the files the set-up made:\n{_tail(overlay.output, 1000)}")
    progress(f"environment: ready in {time.monotonic() - started:.0f} s")


async def _installer(
    sandbox: Sandbox, recipe: EnvironmentRecipe, env: dict[str, str], progress: Progress
) -> EnvironmentRecipe:
    """The recipe as it will install, said in one line: with uv when it asks for uv and the image
    has it (``uv --version``), else with pip (the image was built without uv, or by an older
    clover-agent), saying why."""
    if recipe.installer != "uv":
        progress("environment: installer pip (chosen in .clover/config.toml's [sandbox] installer)")
        return recipe
    found = await sandbox.exec("uv --version", timeout=60, env=env)
    version = found.output.strip().splitlines()[-1] if found.output.strip() else ""
    if found.exit_code == 0 and version.startswith("uv "):
        progress(f"environment: installer {version} (pip is the fallback)")
        return recipe
    progress(
        "environment: installer pip: the sandbox image has no uv (built by an older clover-agent, or "
        "without uv; `clover-agent sandbox build` adds it)"
    )
    return recipe.with_installer("pip")


def _pip_may_do_better(output: str, timed_out: bool) -> bool:
    """Whether a step uv failed is worth running again with pip: not when the time ran out, the
    requirements conflict or are not there, or the index could not be reached or trusted (pip
    would fail the same way); yes otherwise: a requirement file or a build uv takes differently,
    and an extension that failed to build, which some projects' builds (markupsafe's) skip under
    pip; pip failing too for want of a compiler then takes the compiler variant, as before uv."""
    lowered = output.lower()
    return not (timed_out or _UV_NO_SOLUTION in lowered or _unreachable(lowered) or _untrusted(lowered))


async def _run_step(
    sandbox: Sandbox, command: str, timeout: float, env: dict[str, str], progress: Progress
) -> ExecResult:
    """Run one step, reporting the last line of its output every :data:`PROGRESS_EVERY_S`."""
    wrapped = f"set -o pipefail; {{ {command}\n}} 2>&1 | tee {_LOG}"
    task = asyncio.ensure_future(sandbox.exec(wrapped, timeout=timeout, env=env))
    started, last = time.monotonic(), ""
    while True:
        done, _ = await asyncio.wait({task}, timeout=PROGRESS_EVERY_S)
        if done:
            return task.result()
        try:
            text = (await sandbox.read_file(_LOG)).decode("utf-8", "replace")
        except OSError:
            continue
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if lines and lines[-1] != last:
            last = lines[-1]
            progress(f"  {time.monotonic() - started:.0f} s: {last[:160]}")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _tail(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else "[...]\n" + text[-limit:]


#: pip's resolver walking back through a package's releases.
_BACKTRACK = re.compile(r"pip is looking at multiple versions of ([A-Za-z0-9._-]+)")
#: A line of pip's conflict report: one release of a package and what it needs.
_DEPENDS = re.compile(r"^([A-Za-z0-9._-]+) (\S+) depends on (.+)$")
#: ``name==version`` in pip's "Cannot install ..." line.
_PINNED = re.compile(r"([A-Za-z0-9._-]+)==([^\s,]+)")
#: uv's words for a resolution that failed, and the lines of reasons it gives after them (uv 0.13
#: says ``error: No solution found ...`` then ``cause: Because ...``; earlier uvs ``× No solution
#: found ...`` then ``╰─▶ Because ...``; both then ``And because ...`` and ``hint: ...``).
_UV_NO_SOLUTION = "no solution found when resolving"
_UV_REASONS = ("cause:", "╰─▶", "because", "and because", "hint:")
#: uv's words for a requirement no index or wheel folder has.
_UV_NOT_FOUND = ("was not found in the package registry", "was not found in the provided package locations")
#: A package with this many releases in a conflict report was walked back through.
_WALKED_RELEASES = 3


def _walked_back(output: str) -> list[str]:
    """The packages pip's resolver walked back through: those whose releases fill its conflict
    report (the one it tried most first), then those its "looking at multiple versions" names."""
    releases: dict[str, set[str]] = {}
    for line in output.splitlines():
        found = _DEPENDS.match(line.strip())
        if found:
            releases.setdefault(found.group(1), set()).add(found.group(2))
    many = sorted(
        (n for n, v in releases.items() if len(v) >= _WALKED_RELEASES), key=lambda n: -len(releases[n])
    )
    return list(dict.fromkeys([*many, *_BACKTRACK.findall(output)]))


def _conflict_lines(block: list[str]) -> list[str]:
    """pip's conflict report with each package's many releases said once: how many were tried,
    from which to which, and what they need."""
    by_name: dict[str, list[tuple[str, str]]] = {}
    for line in block:
        found = _DEPENDS.match(line)
        if found:
            by_name.setdefault(found.group(1), []).append((found.group(2), found.group(3)))
    out: list[str] = []
    said: set[str] = set()
    for line in block:
        found = _DEPENDS.match(line)
        name = found.group(1) if found else ""
        if not found or len(by_name[name]) < _WALKED_RELEASES:
            out.append(line)
        elif name not in said:
            said.add(name)
            versions = [v for v, _ in by_name[name]]
            needs = "; ".join(dict.fromkeys(need for _, need in by_name[name]))
            out.append(
                f"{len(versions)} releases of {name} ({versions[-1]} … {versions[0]}) depend on {needs}"
            )
    return out


def _cannot_install(line: str) -> str:
    """pip's "Cannot install a==1, b==2, b==3, ..." with each package's many pins counted."""
    pins = _PINNED.findall(line)
    counts: dict[str, list[str]] = {}
    for name, version in pins:
        counts.setdefault(name, []).append(version)
    if not any(len(v) >= _WALKED_RELEASES for v in counts.values()):
        return line
    parts = [
        f"{len(v)} releases of {n} ({v[0]} … {v[-1]})"
        if len(v) >= _WALKED_RELEASES
        else ", ".join(f"{n}=={x}" for x in v)
        for n, v in counts.items()
    ]
    rest = line.split(" because ", 1)[1] if " because " in line else ""
    return f"ERROR: Cannot install {', '.join(parts)}" + (f" because {rest}" if rest else "")


def decisive_lines(output: str, limit: int = 14) -> str:
    """The few lines of a failed step's output that say why (pip's ``ERROR:`` lines, the conflict
    it names, the packages it walked back, a compiler's fatal error), in order, at most ``limit``;
    "" when none stands out."""
    keep: list[str] = []
    block: list[str] | None = None  # the conflict report being read
    uv_report = False  # uv's "No solution found" and the reasons after it being read
    for line in output.splitlines():
        text = line.strip()
        if uv_report:
            if text.lower().startswith(_UV_REASONS):
                keep.append(text)
                continue
            uv_report = False
        if _UV_NO_SOLUTION in text.lower():
            keep.append(text.lstrip("× "))
            uv_report = True
            continue
        if block is not None:
            if not text or text.lower().startswith(("to fix this", "error:")):
                keep += _conflict_lines(block)
                block = None
            else:
                block.append(text)
                continue
        if text.startswith("The conflict is caused by"):
            block = []
            keep.append(text)
        elif text.startswith("ERROR: Cannot install"):
            keep.append(_cannot_install(text))
        elif text.startswith("ERROR:") or text.startswith("error: ") or "fatal error:" in text:
            keep.append(text)
    if block is not None:
        keep += _conflict_lines(block)
    walked = _walked_back(output)
    if walked:
        keep.insert(0, f"pip walked back through the releases of {', '.join(walked)}")
    unique = list(dict.fromkeys(keep))
    return "\n".join(unique[:limit])


def advice(recipe: EnvironmentRecipe, output: str, *, compiler: bool = False, timed_out: bool = False) -> str:
    """How to get past a failed step, from what its output says (``compiler``: the set-up ran in
    the compiler variant of the image; ``timed_out``: the step ran past its limit)."""
    lowered = output.lower()
    walked = _walked_back(output)
    if timed_out:
        why = (
            f"pip was walking back through the releases of {', '.join(walked)} (its resolver backtracking)"
            if walked
            else "a download, a build or the resolver took too long"
            + (f" (its last line: {last[:200]})" if (last := _last_line(output)) else "")
        )
        return (
            f"The step ran past the set-up's limit of {recipe.timeout:.0f} s: {why}. Pin the versions "
            "it walks through (`requirements` or `packages` in .clover/config.toml's [sandbox] table), "
            'or make the install faster with a wheel folder (`wheels = "DIR"`).'
        )
    if any(s in lowered for s in _UV_NOT_FOUND):
        return _not_available(recipe)
    uv_conflict = _UV_NO_SOLUTION in lowered
    if "resolutionimpossible" in lowered or "conflicting dependencies" in lowered or uv_conflict:
        back = f" pip walked back through the releases of {', '.join(walked)} first." if walked else ""
        return (
            "The requirements conflict: no set of versions satisfies them all (the conflict "
            f"{'uv' if uv_conflict else 'pip'} names is above).{back} Change the pins in the project's "
            "dependency files, or choose what to install in .clover/config.toml's [sandbox] table "
            "(requirements, packages, extras)."
        )
    if _untrusted(lowered):
        return (
            "The package index's TLS certificate was not trusted: set pip's `cert` (pip config set "
            "global.cert /path/to/ca-bundle.pem) or PIP_CERT on this machine to the CA bundle your "
            "network needs; clover-agent copies it into the set-up."
        )
    if _unreachable(lowered):
        return (
            "The package index could not be reached from the sandbox. Check pip's index-url / proxy "
            "settings on this machine, or install offline from a wheel folder made with `pip download "
            '-d DIR ...`: `wheels = "DIR"` in .clover/config.toml\'s [sandbox] table, or --wheels DIR.'
        )
    if compiler and (_needs_a_compiler(lowered) or _MISSING_HEADER.search(lowered)):
        return (
            "An extension had to be built from source and could not be, although the sandbox had "
            f"{COMPILER_PACKAGES} (--with-compiler): it needs more than those, such as a library's "
            "headers (a `fatal error: NAME.h` above; Debian's libNAME-dev), a C++ compiler (g++) or "
            "Rust. Build an image with what it needs FROM clover-agent-sandbox:latest and pass it as "
            "`--image IMG` (or `image` in .clover/config.toml's [sandbox] table), or pin a version of "
            "the package that has a wheel for this Python."
        )
    if _needs_a_compiler(lowered):
        return (
            "A C extension had to be built from source and could not be: the sandbox image has no C "
            "compiler (gcc) and no Python headers (python3-dev), so only packages with a wheel for "
            "this Python install. Run with `--with-compiler` (or set `compiler = true` in "
            ".clover/config.toml's [sandbox] table): the sandbox then starts from the image's compiler "
            f"variant, with {COMPILER_PACKAGES}, built once and cached (`clover-agent sandbox build "
            "--with-compiler` builds it ahead of time). Or start from an image of your own that has "
            "them (`--image IMG`), or pin a version of the package that has a wheel for this Python."
        )
    if "no matching distribution" in lowered or "could not find a version" in lowered:
        return _not_available(recipe)
    return (
        "Fix the project's dependency files, or choose the set-up in .clover/config.toml's [sandbox] "
        'table (extras, dependency_groups, requirements, packages, setup, or environment = "none").'
    )


def _not_available(recipe: EnvironmentRecipe) -> str:
    where = "in the wheel folder" if recipe.offline else "on the package index"
    return (
        f"A requirement is not available {where}: check its name and version in the dependency "
        "files, or choose what to install in .clover/config.toml's [sandbox] table (extras, "
        'requirements, packages, or environment = "none").'
    )


#: What pip and the build back ends print when a C/C++ extension cannot be compiled here.
_NO_COMPILER = (
    "command 'gcc' failed",
    "command 'cc' failed",
    "command 'x86_64-linux-gnu-gcc' failed",
    "unable to execute 'gcc'",
    "unable to execute 'cc'",
    "gcc: not found",
    "cc: not found",
    "python.h: no such file or directory",
    "unknown compiler(s)",
    "could not find a c compiler",
    "no cmake_c_compiler could be found",
    "error: linker `cc` not found",
    # a build that catches the failure and falls back says it in these words (markupsafe, simplejson)
    "the c extension could not be compiled",
)


_NO_COMPILER_PROGRAM = re.compile(r"no such file or directory: '(?:[\w.-]+-)?(?:gcc|cc|g\+\+|c\+\+|clang)'")


#: A C compiler's words for a header that is not installed ("fatal error: ffi.h: no such file").
_MISSING_HEADER = re.compile(r"fatal error: [\w./+-]+\.h(?:pp)?: no such file or directory")


def _untrusted(lowered: str) -> bool:
    """pip's and uv's words for a TLS certificate this machine's CA bundle does not vouch for."""
    return any(
        s in lowered
        for s in (
            "certificate verify failed",
            "ssl:",
            "sslerror",
            "invalid peer certificate",
            "unknownissuer",
        )
    )


def _unreachable(lowered: str) -> bool:
    """pip's and uv's words for an index that cannot be reached."""
    return any(
        s in lowered
        for s in (
            "temporary failure in name resolution",
            "connection refused",
            "network is unreachable",
            "max retries exceeded",
            "dns error",
            "error sending request for url",
            "failed to lookup address",
        )
    )


def _needs_a_compiler(lowered: str) -> bool:
    return any(s in lowered for s in _NO_COMPILER) or _NO_COMPILER_PROGRAM.search(lowered) is not None


def commit_changes(recipe_repo: str, base_image_id: str) -> list[str]:
    """Dockerfile instructions for the committed image: the environment first on ``PATH``, and the
    labels :func:`superseded_environment_images` reads."""
    env = [f"ENV {name}={value}" for name, value in SANDBOX_ENVIRONMENT.items()]
    labels = {
        LABEL_ENV: "1",
        LABEL_ENV_BASE: base_image_id,
        LABEL_ENV_REPO: recipe_repo,
        LABEL_ENV_CREATED: str(int(time.time())),
    }
    return [*env, *(f'LABEL "{key}"="{value}"' for key, value in labels.items())]


def environment_images(client: docker.DockerClient) -> list[dict[str, Any]]:
    """Every environment image on the engine (the API's image summaries)."""
    return client.api.images(filters={"label": f"{LABEL_ENV}=1"})


def superseded_environment_images(
    client: docker.DockerClient, *, everything: bool = False, stale_bases: Collection[str] = ()
) -> list[dict[str, Any]]:
    """Environment images no sandbox will start from again: those made from an image that is no
    longer tagged (the sandbox image was rebuilt since) or whose id is in ``stale_bases`` (a
    compiler variant about to be removed), and all but the newest of each repository (its
    dependency files changed since). All of them with ``everything``."""
    images = environment_images(client)
    if everything:
        return images
    tagged_ids = {
        i["Id"] for i in client.api.images() if any(t != "<none>:<none>" for t in i.get("RepoTags") or [])
    }
    tagged_ids -= set(stale_bases)
    old: list[dict[str, Any]] = []
    newest: dict[str, tuple[int, dict[str, Any]]] = {}  # repository → (created, image)
    for image in images:
        labels = image.get("Labels") or {}
        if labels.get(LABEL_ENV_BASE) not in tagged_ids:
            old.append(image)
            continue
        repo = labels.get(LABEL_ENV_REPO, "")
        created = int(labels.get(LABEL_ENV_CREATED, "0") or 0)
        best = newest.get(repo)
        if best is None:
            newest[repo] = (created, image)
        else:
            older = image if created < best[0] else best[1]
            old.append(older)
            if older is best[1]:
                newest[repo] = (created, image)
    return old


def remove_images(client: docker.DockerClient, images: list[dict[str, Any]]) -> list[str]:
    """Remove images (not in use by a container); return the ids removed."""
    from docker.errors import APIError, NotFound

    removed = []
    for image in images:
        try:
            client.api.remove_image(image["Id"], force=False)
            removed.append(image["Id"])
        except NotFound:
            pass
        except APIError as exc:  # in use by a running sandbox: kept for now
            log.info("kept environment image %s: %s", image["Id"][:19], exc)
    return removed
