# The sandbox variant of a SWE-bench instance image (built FROM the local image, no registry):
# /testbed, where the instance's repository, environment and eval script expect it, is the
# sandbox's workspace (a copy of the repository; the image's own /testbed is removed), and the
# Docker sandbox's non-root user exists. EDITABLE (an instance whose spec installs the project
# as a copy, `pip install .`): the project is installed editable first, offline, so its tests
# import the workspace's code as swebench's eval script makes them do by installing it again
# (which the sandbox's read-only root file system does not allow). The rest is the instance image.
ARG BASE
FROM ${BASE}
ARG EDITABLE=
USER 0:0
RUN if [ -n "$EDITABLE" ]; then cd /testbed && . /opt/miniconda3/bin/activate && conda activate testbed \
        && python -m pip install --quiet --no-deps --no-index --no-build-isolation -e . ; fi
RUN (getent group 1000 >/dev/null || groupadd --gid 1000 agent) \
    && (getent passwd 1000 >/dev/null || useradd --uid 1000 --gid 1000 --create-home --shell /bin/bash agent) \
    && rm -rf /testbed && mkdir -p /workspace && chown 1000:1000 /workspace && ln -s /workspace /testbed \
    && printf '[safe]\n\tdirectory = *\n[user]\n\tname = clover-agent\n\temail = clover-agent@localhost\n' >> /etc/gitconfig
ENV LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 HOME=/tmp WORKSPACE=/workspace
WORKDIR /workspace
USER 1000:1000
