"""The sandbox variant of a SWE-bench instance image (``sandboxes/images/swebench.Dockerfile``):
``/testbed`` is the workspace, the sandbox's user runs it, it is built once per instance image,
and ``sandbox prune`` removes it once its instance image is gone."""

from __future__ import annotations

import io
import uuid

import pytest

from clover_agent.sandboxes.images import DEFAULT_BASE_IMAGE, swebench_image, swebench_images
from tests.cli_process import run_cli

pytestmark = [pytest.mark.docker]


@pytest.mark.xdist_group("sandbox-prune")  # another `sandbox prune` may run beside it
def test_testbed_is_the_workspace_and_prune_removes_the_variant_of_a_gone_instance_image() -> None:
    import docker

    client = docker.from_env()
    name = f"clover-test-instance:{uuid.uuid4().hex[:12]}"
    recipe = f"FROM {DEFAULT_BASE_IMAGE}\nRUN mkdir /testbed && echo base > /testbed/f\nLABEL t={name}\n"
    instance, _ = client.images.build(fileobj=io.BytesIO(recipe.encode()), tag=name, rm=True)
    variant = ""
    try:
        variant = swebench_image(client, name, editable=False, progress=lambda _line: None)
        assert swebench_image(client, name, editable=False, progress=lambda _line: None) == variant
        out = client.containers.run(variant, ["bash", "-c", "readlink /testbed; id -u; pwd"], remove=True)
        assert out.decode().split() == ["/workspace", "1000", "/workspace"]
        assert variant not in {t for i in swebench_images(client) for t in i.get("RepoTags") or []}
        client.images.remove(name)  # the instance image untagged (rebuilt, or removed)
        prune = run_cli("sandbox", "prune", timeout=300)
        assert prune.returncode == 0, prune.stderr
        assert "SWE-bench variant(s)" in prune.stdout
        assert not any(variant in (i.tags or []) for i in client.images.list())
    finally:
        for image in (variant, instance.id):
            try:
                client.images.remove(image, force=True)
            except Exception:  # already gone
                pass
