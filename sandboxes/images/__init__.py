"""Sandbox image recipes: the default image's ``Dockerfile`` and ``make-base-image.sh``, which makes
its base without any registry (debootstrap + ``docker import``). Built by ``clover-agent sandbox
build``; no registry is ever contacted."""

from __future__ import annotations

import re
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
#: The label ``make-base-image.sh`` records its recipe in.
BASE_RECIPE_LABEL = "clover-agent.base-recipe"


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
