#!/usr/bin/env bash
# Make the sandbox base image without any image registry: Debian's debootstrap builds a minimal
# bookworm root file system from a Debian mirror, and `docker import` turns it into an image.
#
# Usage: bash sandboxes/images/make-base-image.sh [TAG]
#   TAG     image tag to create (default: clover-agent-base:bookworm)
# Environment:
#   DEBIAN_MIRROR   mirror URL (default: the first deb.debian.org-style URI in apt's sources,
#                   else http://deb.debian.org/debian)
#   FORCE=1         rebuild even when the tag is already current
#
# Idempotent: exits at once when the tag is present and was made from this recipe. The image is
# labelled with the recipe (clover-agent.base-recipe: the suite, the packages and RECIPE_REVISION),
# so an image made by an older version of this script is rebuilt, not silently kept. Bump
# RECIPE_REVISION when a change other than the package list must reach existing machines.
# Needs debootstrap and docker, and root for debootstrap and the root file system it makes: run it
# as root, or as a user with passwordless sudo (a GitHub-hosted runner's `runner`), and the steps
# that need root go through `sudo -n`; the rest (docker included) runs as the user.
set -euo pipefail

TAG="${1:-clover-agent-base:bookworm}"
SUITE=bookworm
# python3-venv: the project environments (a virtual environment per project, with pip);
# python-is-python3: `python` outside them; python3-pytest: tests when no environment is set up.
PACKAGES=python3,python3-venv,python-is-python3,python3-pytest,git,ripgrep,procps,ca-certificates
RECIPE_REVISION=2
RECIPE="$SUITE;$PACKAGES;$RECIPE_REVISION"

if [[ "${FORCE:-0}" != 1 ]] && docker image inspect "$TAG" >/dev/null 2>&1; then
    have="$(docker image inspect --format '{{ index .Config.Labels "clover-agent.base-recipe" }}' "$TAG" 2>/dev/null || true)"
    if [[ "$have" == "$RECIPE" ]]; then
        echo "base image $TAG already present and current (FORCE=1 to rebuild)"
        exit 0
    fi
    echo "base image $TAG was made from another recipe (${have:-none recorded}); rebuilding it"
fi

if ! command -v debootstrap >/dev/null 2>&1; then
    echo "debootstrap is not installed (Debian/Ubuntu: apt-get install debootstrap)" >&2
    exit 1
fi
# AS_ROOT: the prefix of every command that needs root (none when we are root).
if [[ "$(id -u)" == 0 ]]; then
    AS_ROOT=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    AS_ROOT=(sudo -n)
    echo "not root: debootstrap and the root file system's steps run through sudo"
else
    echo "debootstrap needs root: run this script as root, or as a user with passwordless sudo" >&2
    exit 1
fi
as_root() { "${AS_ROOT[@]}" "$@"; }

mirror_from_apt() {
    # First main-archive URI in apt's sources (deb822 "URIs:" or one-line "deb URI suite ...").
    local files=(/etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources)
    local f uri
    for f in "${files[@]}"; do
        [[ -r "$f" ]] || continue
        while read -r uri; do
            if [[ "$uri" == */debian && "$uri" != *security* ]]; then
                echo "$uri"
                return 0
            fi
        done < <(sed -n -e 's/^URIs:[[:space:]]*//p' -e 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\).*/\2/p' "$f" | tr ' ' '\n')
    done
    return 1
}
MIRROR="${DEBIAN_MIRROR:-$(mirror_from_apt || echo http://deb.debian.org/debian)}"

ROOTFS="$(mktemp -d /var/tmp/clover-base.XXXXXX)"
trap 'as_root rm -rf "$ROOTFS"' EXIT

echo "debootstrap $SUITE from $MIRROR into $ROOTFS (packages: $PACKAGES)"
as_root debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR"

# Trim what a sandbox never needs: package caches and lists, documentation.
as_root rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* \
    "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/locale/*

echo "docker import -> $TAG"
as_root tar --numeric-owner -C "$ROOTFS" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    --change "LABEL clover-agent.base-recipe=$RECIPE" \
    - "$TAG"
echo "base image $TAG ready"
