# The compiler variant of a sandbox image (`--with-compiler`, `compiler = true` in
# .clover/config.toml's [sandbox] table): the image plus a C compiler, the C library's headers and
# the Python headers of the image's own python3, so a project's C extension builds in its
# environment. Built once per sandbox image by clover-agent (sandboxes/images/__init__.py tags it
# by a hash of the image's id and this file); apt fetches the packages from the image's Debian
# mirror (its /etc/apt/sources.list, as debootstrap wrote it), so the build needs that mirror.
ARG BASE=clover-agent-sandbox:latest
FROM ${BASE}
# The user the image runs as, restored after the install (the sandbox runs as uid 1000 anyway).
ARG RUN_AS=1000:1000
USER 0:0
RUN export DEBIAN_FRONTEND=noninteractive \
    && apt-get update -q \
    && apt-get install -y -q --no-install-recommends gcc libc6-dev python3-dev \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /usr/share/doc/* /usr/share/man/* /usr/share/locale/* \
    && python3 -c 'import pathlib, sys, sysconfig; h = pathlib.Path(sysconfig.get_paths()["include"], "Python.h"); sys.exit(0 if h.is_file() else f"{h} is missing: python3-dev does not match this image'"'"'s python3 {sys.version.split()[0]}")' \
    && gcc --version | head -1
USER ${RUN_AS}
