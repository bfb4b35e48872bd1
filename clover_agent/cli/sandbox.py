"""``clover-agent sandbox build|prune``: make the sandbox image locally, remove leftover containers."""

from __future__ import annotations

import argparse

from clover_agent.errors import ExitCode
from clover_agent.sandboxes.errors import SandboxUnavailable
from clover_agent.settings import DEFAULT_SANDBOX_IMAGE, Settings


def _build(args: argparse.Namespace) -> int:
    from clover_agent.sandboxes.docker import docker_client
    from clover_agent.sandboxes.images import (
        COMPILER_PACKAGES,
        DEFAULT_BASE_IMAGE,
        UV_VERSION,
        base_is_current,
        build_sandbox_image,
        compiler_image,
        image_exists,
        make_base_image,
        uv_binary,
    )

    settings = Settings.load()
    client = docker_client(settings.docker_env, offer_local=False)
    base = args.base or DEFAULT_BASE_IMAGE
    if args.base is None and not base_is_current(client, base):
        why = "made from an older recipe" if image_exists(client, base) else "missing"
        print(f"base image {base} is {why}: making it with debootstrap (a few minutes)", flush=True)
        make_base_image(base)
    elif not image_exists(client, base):
        raise SandboxUnavailable(
            f"the base image {base} is not on this Docker engine and no registry is used to fetch it: "
            "build or `docker import` it first, or leave out --base to make "
            f"{DEFAULT_BASE_IMAGE} with debootstrap"
        )
    uv, why = uv_binary(settings.home / "uv", client.info().get("Architecture") or "")
    if uv is None:
        print(
            f"uv {UV_VERSION} could not be had ({why}): the image is built without it, and projects' "
            "environments are set up with pip",
            flush=True,
        )
    print(f"building {args.tag} FROM {base}" + (f" (uv {UV_VERSION})" if uv else ""), flush=True)
    image_id = build_sandbox_image(
        client, base=base, tag=args.tag, progress=(lambda _line: None) if args.quiet else print, uv=uv
    )
    print(f"built {args.tag} ({image_id[:19]})")
    if args.with_compiler:
        print(f"compiler variant of {args.tag} ({COMPILER_PACKAGES} from Debian's mirror)", flush=True)
        tag, new = compiler_image(
            client,
            args.tag,
            progress=(lambda _line: None) if args.quiet else print,
            host_env=settings.environment,
        )
        print(
            f"{'built' if new else 'already built (cached)'}: {tag}; the sandbox starts from it with "
            "--with-compiler or `compiler = true` in .clover/config.toml's [sandbox] table"
        )
    return ExitCode.OK


def _prune(args: argparse.Namespace) -> int:
    from clover_agent.sandboxes.docker import docker_client, remove_containers, stale_containers
    from clover_agent.sandboxes.env_image import remove_images, superseded_environment_images
    from clover_agent.sandboxes.images import compiler_images, swebench_images
    from clover_agent.sandboxes.local import reap_stale_copies

    client = docker_client(Settings.load().docker_env, offer_local=False)
    removed = remove_containers(client, stale_containers(client, everything=args.all))
    copies = reap_stale_copies()
    stale_variants = compiler_images(client, everything=args.all)
    # the environments made over a stale variant go with it, first (an image's parent stays while it does)
    old = superseded_environment_images(
        client, everything=args.all, stale_bases={v["Id"] for v in stale_variants}
    )
    images = remove_images(client, old)
    variants = remove_images(client, stale_variants)
    swebench = remove_images(client, swebench_images(client, everything=args.all))
    print(
        f"removed {len(removed)} sandbox container(s), {len(copies)} local sandbox copy(ies), "
        f"{len(images)} environment image(s), {len(variants)} compiler variant(s) and "
        f"{len(swebench)} SWE-bench variant(s)"
    )
    return ExitCode.OK


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sandbox",
        help="build the sandbox image, remove leftover sandboxes",
        description="Manage the Docker sandbox. Images are built locally; no registry is used.",
    )
    actions = p.add_subparsers(dest="sandbox_command", metavar="ACTION", required=True)
    build = actions.add_parser(
        "build",
        help=f"build {DEFAULT_SANDBOX_IMAGE} (Python 3, git, pytest, ripgrep, user agent uid 1000)",
        description="Build the sandbox image from sandboxes/images/Dockerfile. Without --base, the "
        "base image clover-agent-base:bookworm is made first when missing (debootstrap + docker "
        "import; needs root). Fast when nothing changed (cached layers).",
    )
    build.add_argument("--base", metavar="IMAGE", help="build FROM this local image instead")
    build.add_argument("--tag", default=DEFAULT_SANDBOX_IMAGE, help="tag to build (default: %(default)s)")
    build.add_argument(
        "--with-compiler",
        action="store_true",
        help="also build the image's compiler variant (gcc, libc6-dev and python3-dev from Debian's "
        "mirror), which --with-compiler and [sandbox] compiler = true start from; otherwise it is built "
        "on first use",
    )
    build.add_argument("--quiet", "-q", action="store_true", help="do not print the build steps")
    build.set_defaults(func=_build)
    prune = actions.add_parser(
        "prune",
        help="remove leftover sandboxes and old environment images",
        description="Remove containers labelled clover-agent=1 whose owner process is gone (all of "
        "them with --all), local-sandbox copies of dead processes, and environment images no run "
        "starts from any more: those made from a sandbox image that was rebuilt since, and all but "
        "the newest of each repository; and compiler variants of images rebuilt since or of an older "
        "recipe, with the environments made over them; and SWE-bench variants (eval --swebench) whose "
        "instance image is gone (every environment image and variant with --all).",
    )
    prune.add_argument(
        "--all",
        action="store_true",
        help="also remove sandboxes of running processes, every environment image and every compiler "
        "and SWE-bench variant",
    )
    prune.set_defaults(func=_prune)
