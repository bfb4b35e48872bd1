"""Sandbox image recipes: the default image's ``Dockerfile`` and ``make-base-image.sh``, which makes
its base without any registry (debootstrap + ``docker import``), built by ``clover-agent sandbox
build``; and ``compiler.Dockerfile``, the compiler variant of a sandbox image (gcc, libc6-dev and
python3-dev from the image's Debian mirror), built once per image and tagged by a hash of its
inputs (:func:`compiler_image`). No image registry is ever contacted."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clover_agent.sandboxes.errors import SandboxUnavailable

if TYPE_CHECKING:
    import docker

IMAGES_DIR = Path(__file__).resolve().parent
BASE_SCRIPT = IMAGES_DIR / "make-base-image.sh"
DEFAULT_BASE_IMAGE = "clover-agent-base:bookworm"
#: Tag of the sandbox image `clover-agent sandbox build` makes and the Docker sandbox uses by default.
DEFAULT_SANDBOX_IMAGE = "clover-agent-sandbox:latest"
#: The label ``make-base-image.sh`` records its recipe in.
BASE_RECIPE_LABEL = "clover-agent.base-recipe"
COMPILER_DOCKERFILE = IMAGES_DIR / "compiler.Dockerfile"
#: Where compiler variants are tagged: ``clover-agent-compiler:<key>`` (:func:`compiler_tag`).
COMPILER_REPOSITORY = "clover-agent-compiler"
LABEL_COMPILER = "clover-agent.compiler"
LABEL_COMPILER_BASE = "clover-agent.compiler.base"  # the id of the image it was built FROM
#: What the variant adds, as the messages name it.
COMPILER_PACKAGES = "gcc, libc6-dev and python3-dev"
#: How long the variant's build may stream nothing before the client gives up (apt on a slow mirror).
COMPILER_BUILD_TIMEOUT_S = 1800
#: The host's proxy variables, handed to the build (Docker's predefined build arguments, which are
#: not kept in the image's history), so apt reaches the mirror the way this machine does.
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")
#: The uv the sandbox image holds (``/usr/local/bin/uv``), the installer environments are set up
#: with; pinned, so an image is what its recipe says. A new pin gives the image a new id, and so
#: every environment made over it a new cache key.
UV_VERSION = "0.13.9"
#: The label the sandbox image records its uv version in (``none``: built without uv).
LABEL_UV = "clover-agent.uv"
#: The wheel platform of each Docker architecture (``docker info``'s ``Architecture``).
_WHEEL_PLATFORMS = {
    "x86_64": "manylinux_2_17_x86_64",
    "amd64": "manylinux_2_17_x86_64",
    "aarch64": "manylinux_2_17_aarch64",
    "arm64": "manylinux_2_17_aarch64",
}


def image_exists(client: docker.DockerClient, tag: str) -> bool:
    from docker.errors import ImageNotFound

    try:
        client.api.inspect_image(tag)
    except ImageNotFound:
        return False
    return True


def base_recipe() -> str:
    """The recipe ``make-base-image.sh`` labels its image with (``SUITE;PACKAGES;RECIPE_REVISION``),
    read from the script itself so the two never disagree."""
    text = BASE_SCRIPT.read_text()
    values = {}
    for name in ("SUITE", "PACKAGES", "RECIPE_REVISION"):
        match = re.search(rf"^{name}=(\S+)$", text, re.MULTILINE)
        if match is None:
            raise RuntimeError(f"{BASE_SCRIPT} sets no {name}")
        values[name] = match[1]
    return f"{values['SUITE']};{values['PACKAGES']};{values['RECIPE_REVISION']}"


def base_is_current(client: docker.DockerClient, tag: str) -> bool:
    """Whether ``tag`` exists and was made from this version's recipe (an image made by an older
    ``make-base-image.sh`` lacks packages the sandbox now needs, such as python3-venv)."""
    from docker.errors import ImageNotFound

    try:
        labels = client.api.inspect_image(tag)["Config"].get("Labels") or {}
    except ImageNotFound:
        return False
    return labels.get(BASE_RECIPE_LABEL) == base_recipe()


def make_base_image(tag: str = DEFAULT_BASE_IMAGE) -> None:
    """Run ``make-base-image.sh`` (its output goes to the terminal); it skips an existing tag."""
    result = subprocess.run(["bash", str(BASE_SCRIPT), tag], check=False)
    if result.returncode != 0:
        raise SandboxUnavailable(
            f"making the base image {tag} failed (exit {result.returncode}; see the output above). "
            f"The script needs root and debootstrap: run `sudo bash {BASE_SCRIPT}`, or pass an "
            "existing Debian/Ubuntu image with Python 3, git and ripgrep as `--base IMAGE`"
        )


def uv_binary(cache: Path, architecture: str, *, python: str = sys.executable) -> tuple[Path | None, str]:
    """uv's binary for Linux on ``architecture`` (the Docker engine's), at :data:`UV_VERSION`: from
    its wheel on the package index, fetched with ``python``'s pip (so with this machine's pip
    configuration: its index, proxy and CA bundle) and kept in ``cache``. Returns the binary, or
    None and why it could not be had."""
    platform = _WHEEL_PLATFORMS.get(architecture.lower())
    if platform is None:
        return None, f"no uv wheel is known for the architecture {architecture}"
    binary = cache / f"uv-{UV_VERSION}-{platform}" / "uv"
    if binary.is_file():
        return binary, ""
    with tempfile.TemporaryDirectory(prefix="clover-uv-") as tmp:
        command = [python, "-m", "pip", "download", f"uv=={UV_VERSION}", "--no-deps", "--only-binary=:all:"]
        command += [
            "--platform",
            platform,
            "--python-version",
            "3.11",
            "--disable-pip-version-check",
            "-d",
            tmp,
        ]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"`pip download uv=={UV_VERSION}` did not run ({exc})"
        wheels = sorted(Path(tmp).glob("uv-*.whl"))
        if done.returncode != 0 or not wheels:
            last = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
            return None, f"`pip download uv=={UV_VERSION}` failed: {last}"
        member = f"uv-{UV_VERSION}.data/scripts/uv"
        try:
            with zipfile.ZipFile(wheels[0]) as wheel:
                data = wheel.read(member)
        except (zipfile.BadZipFile, KeyError, OSError) as exc:
            return None, f"the uv wheel {wheels[0].name} has no {member} ({exc})"
    try:
        binary.parent.mkdir(parents=True, exist_ok=True)
        partial = binary.with_suffix(".partial")
        partial.write_bytes(data)
        partial.chmod(0o755)
        partial.replace(binary)
    except OSError as exc:
        return None, f"uv's binary could not be kept in {binary.parent} ({exc.strerror or exc})"
    return binary, ""


def build_sandbox_image(
    client: docker.DockerClient,
    *,
    base: str,
    tag: str,
    progress: Callable[[str], None],
    uv: Path | None = None,
) -> str:
    """Build the sandbox image ``tag`` FROM ``base`` with the Docker SDK; return its id. ``uv``: the
    uv binary (:func:`uv_binary`) put at ``/usr/local/bin/uv``; without it the image has no uv
    (its label :data:`LABEL_UV` says ``none``) and environments are set up with pip.

    Cached layers make a rebuild of an unchanged recipe take about a second.
    """
    from docker.errors import APIError, BuildError

    image_id = None
    with tempfile.TemporaryDirectory(prefix="clover-sandbox-build-") as context:
        shutil.copy(IMAGES_DIR / "Dockerfile", Path(context) / "Dockerfile")
        tools = Path(context) / "tools"
        tools.mkdir()
        if uv is not None:
            shutil.copy(uv, tools / "uv")
            (tools / "uv").chmod(0o755)
        args = {"BASE": base, "UV_VERSION": UV_VERSION if uv is not None else "none"}
        try:
            for chunk in client.api.build(
                path=context, tag=tag, buildargs=args, rm=True, forcerm=True, decode=True
            ):
                if "error" in chunk:
                    raise SandboxUnavailable(f"building {tag} failed: {chunk['error'].strip()}")
                line = (chunk.get("stream") or "").rstrip("\n")
                if line.strip():
                    progress(line)
                aux = chunk.get("aux") or {}
                image_id = aux.get("ID", image_id)
        except (APIError, BuildError) as exc:
            raise SandboxUnavailable(f"building {tag} failed: {exc}") from None
    return image_id or client.api.inspect_image(tag)["Id"]


def compiler_tag(base_image_id: str) -> str:
    """The compiler variant's tag for the image of ``base_image_id``: a hash of that id and of
    ``compiler.Dockerfile``, so a rebuilt sandbox image or a changed recipe gets a variant of its
    own and a stale one is never used."""
    material = base_image_id.encode() + b"\0" + COMPILER_DOCKERFILE.read_bytes()
    return f"{COMPILER_REPOSITORY}:{hashlib.sha256(material).hexdigest()[:24]}"


def compiler_image(
    client: docker.DockerClient,
    base: str,
    *,
    progress: Callable[[str], None],
    host_env: Mapping[str, str] | None = None,
) -> tuple[str, bool]:
    """The tag of the compiler variant of the local image ``base``, built first when it is not on
    the engine; and whether it was built now (False: reused from the cache). ``host_env``: the
    host's proxy variables (:data:`PROXY_VARIABLES`) are passed to the build. The build's output
    goes to ``progress``; a failed build is :class:`SandboxUnavailable` with its last lines."""
    import requests
    from docker.errors import APIError, BuildError, ImageNotFound

    try:
        inspected = client.api.inspect_image(base)
    except ImageNotFound:
        raise SandboxUnavailable(
            f"the sandbox image {base} is not on this Docker engine, so its compiler variant cannot be "
            "built: build it first with `clover-agent sandbox build --with-compiler`"
        ) from None
    base_id = inspected["Id"]
    tag = compiler_tag(base_id)
    if image_exists(client, tag):
        return tag, False
    run_as = (inspected.get("Config") or {}).get("User") or "0:0"
    args = {"BASE": base_id, "RUN_AS": run_as}
    args |= {name: value for name in PROXY_VARIABLES if (value := (host_env or {}).get(name))}
    lines: list[str] = []
    try:
        for chunk in client.api.build(
            path=str(IMAGES_DIR),
            dockerfile=COMPILER_DOCKERFILE.name,
            tag=tag,
            buildargs=args,
            labels={LABEL_COMPILER: "1", LABEL_COMPILER_BASE: base_id},
            rm=True,
            forcerm=True,
            decode=True,
            timeout=COMPILER_BUILD_TIMEOUT_S,
        ):
            if "error" in chunk:
                raise _compiler_build_failed(base, chunk["error"], lines)
            line = (chunk.get("stream") or "").rstrip("\n")
            if line.strip():
                lines.append(line)
                progress(line)
    except (APIError, BuildError) as exc:
        raise _compiler_build_failed(base, str(exc), lines) from None
    except requests.exceptions.RequestException as exc:  # no answer: a timeout, a lost connection
        raise SandboxUnavailable(
            f"the Docker engine stopped answering while building the compiler variant of {base} "
            f"({type(exc).__name__}); check `docker info` and try again (a variant the engine finished is reused)"
        ) from None
    return tag, True


def _compiler_build_failed(base: str, error: str, lines: list[str]) -> SandboxUnavailable:
    tail = "\n".join(lines[-15:])
    return SandboxUnavailable(
        f"building the compiler variant of {base} failed: {error.strip()}\n{tail}\n"
        f"It installs {COMPILER_PACKAGES} with apt from the image's Debian mirror (its "
        "/etc/apt/sources.list), so that mirror must be reachable from a container on this machine "
        "(this machine's HTTP_PROXY/HTTPS_PROXY are passed on). Otherwise build an image with them "
        "yourself, FROM the sandbox image, and pass it as `--image IMG` without --with-compiler"
    )


def compiler_images(client: docker.DockerClient, *, everything: bool = False) -> list[dict[str, Any]]:
    """Compiler variants no sandbox will start from again: those built FROM an image that is no
    longer tagged (the sandbox image was rebuilt since) or from another ``compiler.Dockerfile``
    (their tag is not :func:`compiler_tag` of their image). All of them with ``everything``.
    (Environment images made from a variant inherit its labels; they are not variants.)"""
    found = [
        i
        for i in client.api.images(filters={"label": f"{LABEL_COMPILER}=1"})
        if (i.get("Labels") or {}).get(LABEL_COMPILER_BASE)
        and not (i.get("Labels") or {}).get("clover-agent.env")
    ]
    if everything:
        return found
    tagged_ids = _tagged_image_ids(client)
    return [
        i
        for i in found
        if (base := i["Labels"][LABEL_COMPILER_BASE]) not in tagged_ids
        or compiler_tag(base) not in (i.get("RepoTags") or [])
    ]


SWEBENCH_DOCKERFILE = IMAGES_DIR / "swebench.Dockerfile"
#: Where the sandbox variants of SWE-bench instance images are tagged (:func:`swebench_image`).
SWEBENCH_REPOSITORY = "clover-agent-swebench"
LABEL_SWEBENCH_BASE = "clover-agent.swebench.base"  # the id of the instance image it was built FROM


def swebench_image(
    client: docker.DockerClient, instance: str, *, editable: bool, progress: Callable[[str], None]
) -> str:
    """The tag of the sandbox variant of the local SWE-bench instance image ``instance``
    (``swebench.Dockerfile``: ``/testbed`` is the workspace; ``editable``: the project installed
    editable first), built when missing; keyed by the instance image's id, the recipe and
    ``editable``, so a rebuilt instance image gets a variant of its own."""
    from docker.errors import APIError, BuildError, ImageNotFound

    try:
        base_id = client.api.inspect_image(instance)["Id"]
    except ImageNotFound:
        raise SandboxUnavailable(
            f"the SWE-bench instance image {instance} is not on this Docker engine"
        ) from None
    material = (
        base_id.encode() + b"\0" + SWEBENCH_DOCKERFILE.read_bytes() + (b"\0editable" if editable else b"")
    )
    tag = f"{SWEBENCH_REPOSITORY}:{hashlib.sha256(material).hexdigest()[:24]}"
    if image_exists(client, tag):
        return tag
    try:
        for chunk in client.api.build(
            path=str(IMAGES_DIR),
            dockerfile=SWEBENCH_DOCKERFILE.name,
            tag=tag,
            buildargs={"BASE": base_id, "EDITABLE": "1" if editable else ""},
            labels={LABEL_SWEBENCH_BASE: base_id},
            rm=True,
            forcerm=True,
            decode=True,
        ):
            if "error" in chunk:
                raise SandboxUnavailable(
                    f"building the sandbox variant of {instance} failed: {chunk['error'].strip()}"
                )
            line = (chunk.get("stream") or "").rstrip("\n")
            if line.strip():
                progress(line)
    except (APIError, BuildError) as exc:
        raise SandboxUnavailable(f"building the sandbox variant of {instance} failed: {exc}") from None
    return tag


def _tagged_image_ids(client: docker.DockerClient) -> set[str]:
    """The ids of the images that still have a tag."""
    return {
        i["Id"] for i in client.api.images() if any(t != "<none>:<none>" for t in i.get("RepoTags") or [])
    }


def swebench_images(client: docker.DockerClient, *, everything: bool = False) -> list[dict[str, Any]]:
    """SWE-bench variants no sandbox will start from again: those whose instance image is no
    longer tagged (removed, or rebuilt since) or that lost their own tag. All of them with
    ``everything``."""
    found = [
        i
        for i in client.api.images(filters={"label": LABEL_SWEBENCH_BASE})
        if (i.get("Labels") or {}).get(LABEL_SWEBENCH_BASE)
    ]
    if everything:
        return found
    tagged_ids = _tagged_image_ids(client)
    return [
        i
        for i in found
        if i["Labels"][LABEL_SWEBENCH_BASE] not in tagged_ids
        or not any(t.startswith(f"{SWEBENCH_REPOSITORY}:") for t in i.get("RepoTags") or [])
    ]
