"""Sandbox image recipes: the default image's ``Dockerfile`` and ``make-base-image.sh``, which makes
its base without any registry (debootstrap + ``docker import``). Built by ``clover-agent sandbox
build``; no registry is ever contacted."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from clover_agent.sandboxes.errors import SandboxUnavailable

if TYPE_CHECKING:
    import docker

IMAGES_DIR = Path(__file__).resolve().parent
BASE_SCRIPT = IMAGES_DIR / "make-base-image.sh"
DEFAULT_BASE_IMAGE = "clover-agent-base:bookworm"
#: Tag of the sandbox image `clover-agent sandbox build` makes and the Docker sandbox uses by default.
DEFAULT_SANDBOX_IMAGE = "clover-agent-sandbox:latest"


def image_exists(client: docker.DockerClient, tag: str) -> bool:
    from docker.errors import ImageNotFound

    try:
        client.api.inspect_image(tag)
    except ImageNotFound:
        return False
    return True


def make_base_image(tag: str = DEFAULT_BASE_IMAGE) -> None:
    """Run ``make-base-image.sh`` (its output goes to the terminal); it skips an existing tag."""
    result = subprocess.run(["bash", str(BASE_SCRIPT), tag], check=False)
    if result.returncode != 0:
        raise SandboxUnavailable(
            f"making the base image {tag} failed (exit {result.returncode}; see the output above). "
            f"The script needs root and debootstrap: run `sudo bash {BASE_SCRIPT}`, or pass an "
            "existing Debian/Ubuntu image with Python 3, git and ripgrep as `--base IMAGE`"
        )


def build_sandbox_image(
    client: docker.DockerClient, *, base: str, tag: str, progress: Callable[[str], None]
) -> str:
    """Build the sandbox image ``tag`` FROM ``base`` with the Docker SDK; return its id.

    Cached layers make a rebuild of an unchanged recipe take about a second.
    """
    from docker.errors import APIError, BuildError

    image_id = None
    try:
        for chunk in client.api.build(
            path=str(IMAGES_DIR), tag=tag, buildargs={"BASE": base}, rm=True, forcerm=True, decode=True
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
