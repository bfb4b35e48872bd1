"""A project's environment in the sandbox: what it is, how it is set up, and what its cache key is.

The project's interpreter and dependencies live in a virtual environment at :data:`VENV` inside
the sandbox, set up once with the network on and kept as a local image keyed by
:meth:`EnvironmentRecipe.cache_key` (:mod:`clover_agent.sandboxes.env_image`; the model is in
environments/README.md). This module holds the data a
:class:`~clover_agent.sandboxes.base.SandboxSpec` carries (:class:`EnvironmentRecipe`,
:class:`PackageIndex`), built by :func:`clover_agent.environments.python_deps.discover` from the
repository's files and by the caller from the host's package-index configuration. Nothing here
reads the host.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit, urlunsplit

#: The environment's folder in the sandbox (``/opt/clover`` belongs to uid 1000 in the image).
VENV = "/opt/clover/venv"
#: Files the set-up made in ``/workspace`` (build metadata, generated ``_version.py``...), kept in
#: the environment image and unpacked into each new workspace copy without replacing its files.
WORKSPACE_OVERLAY = "/opt/clover/workspace-overlay.tar"
#: Where the set-up's inputs go in the set-up container: the CA bundle, ``pip.conf``, a wheel
#: folder. A tmpfs, so none of it is kept in the environment image.
SETUP_DIR = "/tmp/clover-setup"
CA_PATH = f"{SETUP_DIR}/ca.pem"
WHEELS_PATH = f"{SETUP_DIR}/wheels"
#: Bumped when the way an environment is made changes, so older environment images are rebuilt.
RECIPE_VERSION = "1"
#: The installers a set-up can use (``[sandbox] installer`` in ``.clover/config.toml``): uv's pip
#: interface (the sandbox image's ``/usr/local/bin/uv``), else pip, the fallback.
INSTALLERS = ("uv", "pip")
DEFAULT_INSTALLER = "uv"

#: Variables every sandbox started from an environment image has (set in the image).
SANDBOX_ENVIRONMENT = {
    "VIRTUAL_ENV": VENV,
    "PATH": f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
}


@dataclass(frozen=True)
class PackageIndex:
    """Where pip finds packages during set-up: the host's configuration as the sandbox can use it.

    Built from the host's pip configuration (files and ``PIP_*`` variables) by
    ``clover_agent.settings``; URLs only (a host folder or ``file://`` index does not exist in the
    sandbox; :attr:`notes` says what was left out). The CA bundle's content is copied into the
    set-up container, because behind a proxy that presents its own certificate the index is
    reachable only with it.
    """

    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    trusted_hosts: tuple[str, ...] = ()
    ca_bundle: bytes | None = None  # PEM, from pip's ``cert`` (or the host's SSL_CERT_FILE ...)
    proxy: str | None = None  # pip's ``proxy``
    proxy_env: tuple[tuple[str, str], ...] = ()  # HTTP_PROXY, HTTPS_PROXY, NO_PROXY as the host has them
    timeout: str | None = None
    retries: str | None = None
    notes: tuple[str, ...] = ()

    def pip_conf(self, *, ca_path: str | None, find_links: tuple[str, ...] = (), offline: bool) -> str:
        """``pip.conf`` text for the set-up container; ``find_links`` adds folders in the sandbox
        (a wheel folder copied in), ``offline`` uses them alone (``no-index``)."""
        values: dict[str, str] = {}
        if offline:
            values["no-index"] = "true"
        else:
            if self.index_url:
                values["index-url"] = self.index_url
            if self.extra_index_urls:
                values["extra-index-url"] = " ".join(self.extra_index_urls)
            if self.trusted_hosts:
                values["trusted-host"] = " ".join(self.trusted_hosts)
            if self.proxy:
                values["proxy"] = self.proxy
        links = find_links + (() if offline else self.find_links)
        if links:
            values["find-links"] = " ".join(links)
        if ca_path:
            values["cert"] = ca_path
        if self.timeout:
            values["timeout"] = self.timeout
        if self.retries:
            values["retries"] = self.retries
        values["disable-pip-version-check"] = "true"
        values["no-input"] = "true"
        values["progress-bar"] = "off"
        return "[global]\n" + "".join(f"{key} = {value}\n" for key, value in values.items())

    def uv_env(
        self, *, ca_path: str | None, find_links: tuple[str, ...] = (), offline: bool
    ) -> dict[str, str]:
        """The same configuration for uv's pip interface, as its variables: ``index-url`` →
        ``UV_DEFAULT_INDEX``, ``extra-index-url`` → ``UV_EXTRA_INDEX_URL`` (with pip's choice among
        indexes, the best version of any: ``UV_INDEX_STRATEGY=unsafe-best-match``), ``find-links``
        → ``UV_FIND_LINKS``, ``trusted-host`` → ``UV_INSECURE_HOST``, ``proxy`` → ``HTTP_PROXY`` and
        ``HTTPS_PROXY`` where the host sets neither, ``timeout`` → ``UV_HTTP_TIMEOUT``, ``retries``
        → ``UV_HTTP_RETRIES``, ``cert`` → ``SSL_CERT_FILE`` (set by
        :meth:`EnvironmentRecipe.setup_env`). ``offline``: the step itself says ``--no-index``."""
        env: dict[str, str] = {}
        if not offline:
            if self.index_url:
                env["UV_DEFAULT_INDEX"] = self.index_url
            if self.extra_index_urls:
                env["UV_EXTRA_INDEX_URL"] = " ".join(self.extra_index_urls)
                env["UV_INDEX_STRATEGY"] = "unsafe-best-match"
            if self.trusted_hosts:
                env["UV_INSECURE_HOST"] = " ".join(self.trusted_hosts)
            proxies = {name.lower() for name, _ in self.proxy_env}
            if self.proxy and not proxies & {"http_proxy", "https_proxy"}:
                env["HTTP_PROXY"] = env["HTTPS_PROXY"] = self.proxy
        links = find_links + (() if offline else self.find_links)
        if links:
            env["UV_FIND_LINKS"] = ",".join(links)
        if ca_path:
            env["SSL_CERT_FILE"] = ca_path
        if self.timeout:
            env["UV_HTTP_TIMEOUT"] = self.timeout
        if self.retries:
            env["UV_HTTP_RETRIES"] = self.retries
        return env

    def key_material(self) -> dict[str, object]:
        """What of this configuration can change what gets installed (credentials left out, so a
        rotated token does not rebuild every environment)."""
        return {
            "index_url": without_credentials(self.index_url),
            "extra_index_urls": [without_credentials(u) for u in self.extra_index_urls],
            "find_links": [without_credentials(u) for u in self.find_links],
        }


def without_credentials(url: str | None) -> str | None:
    """``url`` without the user-info (``user:password@``) of its address."""
    if not url:
        return url
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


@dataclass(frozen=True)
class SetupStep:
    """One command of the set-up, run in ``/workspace`` with the environment first on ``PATH``."""

    title: str  # what it does, for progress ("install the project (editable) with extras test")
    command: str  # a bash command
    #: The same step with pip, for a step uv runs: what runs instead when the image has no uv, or
    #: when uv fails in a way pip may not (``sandboxes/env_image.py``).
    with_pip: SetupStep | None = None


@dataclass(frozen=True)
class EnvironmentRecipe:
    """What a project's environment is made of; the same recipe over the same base image is the
    same environment (:meth:`cache_key`)."""

    steps: tuple[SetupStep, ...]
    #: What the discovery found, one line each ("pyproject.toml: extras test", ...), shown before
    #: the set-up runs.
    found: tuple[str, ...] = ()
    #: (path, sha256) of every repository file the recipe depends on: the dependency files.
    key_files: tuple[tuple[str, str], ...] = ()
    index: PackageIndex = field(default_factory=PackageIndex)
    #: A host folder of wheels/sdists (e.g. made with ``pip download``) copied into the set-up
    #: container and offered to pip; with ``network`` off, pip installs from it alone.
    wheels: str | None = None
    #: (file name, size) of the wheel folder's files, part of the cache key.
    wheel_files: tuple[tuple[str, int], ...] = ()
    network: bool = True  # the set-up container's network (the sandbox itself never gets it)
    timeout: float = 1800.0  # seconds, per step
    #: Variables of every set-up step from the project's files (a setuptools-scm pretend version),
    #: part of the cache key.
    variables: tuple[tuple[str, str], ...] = ()
    #: Files the steps read from :data:`SETUP_DIR` (name, text), made from the dependency files
    #: (a requirement file without the project's own line), part of the cache key.
    files: tuple[tuple[str, str], ...] = ()
    #: The project's extras installed, and those it declares but not installed with their
    #: distributions' names (what the diagnosis of a missing module names); both follow from the
    #: dependency files, so neither is part of the cache key.
    extras: tuple[str, ...] = ()
    other_extras: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: What installs (:data:`INSTALLERS`): ``uv`` (its steps carry their pip form) or ``pip``.
    installer: str = "pip"

    @property
    def offline(self) -> bool:
        return not self.network

    def with_installer(self, installer: str) -> EnvironmentRecipe:
        """This recipe with pip (its steps' pip form), or as it is."""
        if installer == self.installer or installer != "pip":
            return self
        return replace(self, steps=tuple(s.with_pip or s for s in self.steps), installer="pip")

    def cache_key(self, base_image_id: str) -> str:
        """A hex digest of everything the environment depends on: the image it is made from, the
        steps, the dependency files, the wheel folder's files, the package index and the set-up's
        variables."""
        material: dict[str, object] = {
            "version": RECIPE_VERSION,
            "base": base_image_id,
            "steps": [step.command for step in self.steps],
            "files": sorted(self.key_files),
            "wheels": sorted(self.wheel_files),
            "index": None if self.offline else self.index.key_material(),
            "network": self.network,
        }
        if self.variables:  # only then, so the keys of earlier environments stay as they were
            material["variables"] = sorted(self.variables)
        if self.files:  # likewise
            material["setup_files"] = sorted(self.files)
        return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()

    def setup_env(self) -> dict[str, str]:
        """Variables of every set-up command: the environment first on ``PATH``, pip configured
        by the generated ``pip.conf`` (:meth:`PackageIndex.pip_conf`), the CA bundle for whatever
        else fetches over TLS, and the host's proxy variables; with uv, uv configured alike
        (:meth:`PackageIndex.uv_env`), compiling bytecode and keeping no cache (as pip does), and
        without reading configuration files or ``[tool.uv]`` sources, which pip would not."""
        env = {
            **dict(self.variables),
            **SANDBOX_ENVIRONMENT,
            "PIP_CONFIG_FILE": f"{SETUP_DIR}/pip.conf",
            "PIP_NO_CACHE_DIR": "1",  # a cache in the container's tmpfs would only cost memory
        }
        if self.network:
            env |= dict(self.index.proxy_env)
            if self.index.ca_bundle:
                env |= {"SSL_CERT_FILE": CA_PATH, "REQUESTS_CA_BUNDLE": CA_PATH, "PIP_CERT": CA_PATH}
        if self.installer == "uv":
            # compiled at install, as pip does: the sandbox's root is read-only and Python writes no
            # bytecode there, so without it every command would compile what it imports again
            env |= {"UV_COMPILE_BYTECODE": "1", "UV_NO_CACHE": "1", "UV_NO_CONFIG": "1"}
            # copied from its temporary cache (on another file system: a hard link fails, with a warning)
            env |= {"UV_NO_SOURCES": "1", "UV_NO_PROGRESS": "1", "UV_LINK_MODE": "copy"}
            env |= self.index.uv_env(
                ca_path=CA_PATH if self.network and self.index.ca_bundle else None,
                find_links=(WHEELS_PATH,) if self.wheels else (),
                offline=self.offline,
            )
        return env

    def pip_conf(self) -> str:
        """The set-up's ``pip.conf``."""
        return self.index.pip_conf(
            ca_path=CA_PATH if self.network and self.index.ca_bundle else None,
            find_links=(WHEELS_PATH,) if self.wheels else (),
            offline=self.offline,
        )
