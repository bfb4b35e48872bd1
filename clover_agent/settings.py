"""Every environment variable and user-level setting clover-agent reads, declared in one place.

A command loads :class:`Settings` once (``Settings.load()``) and passes the values down: the engine,
the backends and the sandboxes take explicit paths and values and read no environment variable and
no configuration file themselves. Loading does no I/O beyond reading the environment, the user's
TOML file and (for :func:`repo_settings`) the repository's ``.clover/config.toml``.

Precedence: the command line, then the environment, then the user's config file, then defaults.
For the sandbox image: ``--image``, the repository's file (when the user trusts it:
:data:`TRUSTED_ONLY`), ``CLOVER_SANDBOX_IMAGE``, the user's ``[sandbox] image``, then
:data:`DEFAULT_SANDBOX_IMAGE`.
"""

from __future__ import annotations

import hashlib
import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from clover_agent.environments.recipe import DEFAULT_INSTALLER, INSTALLERS, PackageIndex, without_credentials
from clover_agent.errors import UsageError
from clover_agent.sandboxes.images import DEFAULT_SANDBOX_IMAGE

__all__ = [
    "DEFAULT_SANDBOX_IMAGE",
    "ENV_VARS",
    "REPO_CONFIG",
    "RepoSettings",
    "Settings",
    "config_digest",
    "repo_settings",
    "set_trust",
    "trusted_digest",
    "trusted_only_values",
]

ENV_VARS: dict[str, str] = {
    "CLOVER_MODEL": "folder with the Clover weights (config.json + *.safetensors)",
    "CLOVER_CONFIG": "path of the user config file (TOML); default $XDG_CONFIG_HOME/clover-agent/config.toml",
    "XDG_CONFIG_HOME": "where the user config file lives by default (~/.config)",
    "CLOVER_HOME": "state folder (caches such as the converted vocabulary); default "
    "$XDG_CACHE_HOME/clover-agent",
    "XDG_CACHE_HOME": "where the state folder lives by default (~/.cache)",
    "CLOVER_STATE": "the user's own folder (never in a repository): the key that signs run records, the "
    "repositories whose .clover/config.toml is trusted; default $XDG_STATE_HOME/clover-agent",
    "XDG_STATE_HOME": "where the user's own folder lives by default (~/.local/state)",
    "CLOVER_SANDBOX_IMAGE": f"sandbox image tag; default {DEFAULT_SANDBOX_IMAGE}",
    "OPENAI_API_KEY": "API key for --backend openai (also CLOVER_API_KEY)",
    "CLOVER_API_KEY": "API key for --backend openai, preferred over OPENAI_API_KEY; also the key clients "
    "of `clover-agent serve` must send (its --api-key)",
    "CLOVER_BASE_URL": "default --base-url for --backend openai",
    "CLOVER_CUDA_GRAPHS": "0 runs the engine's decoding steps eager on a CUDA device (default 1: replayed "
    "as CUDA graphs); also [model] cuda_graphs = false",
    "CLOVER_EXPERTS": "how the engine holds Clover's routed experts: auto (as stored), dense, fp8 or int4 "
    "(quantised while loading: about 37 GB and 22 GB of weights instead of 69 GB); also [model] experts",
    "CLOVER_EXPERTS_ON": "where the engine puts Clover's routed experts: device (default) or host (host "
    "memory, computed by the CPU: fits a 16 GB card, many times slower; docs/serving.md); also "
    "[model] experts_on",
    "HF_HOME": "Hugging Face cache root (weights are looked up in its hub/ folder)",
    "HF_HUB_CACHE": "Hugging Face hub cache folder",
    "DOCKER_HOST": "Docker engine to use (remote hosts work)",
    "DOCKER_TLS_VERIFY": "verify the Docker engine's TLS certificate (with DOCKER_HOST)",
    "DOCKER_CERT_PATH": "folder of the Docker engine's TLS client certificates",
    "CLOVER_DOCKER_TIMEOUT": "seconds a slow Docker API call (create, remove, copy) may take; quick ones "
    "(ping, inspect, list) get a quarter; default 120",
    "NO_COLOR": "set (to anything): plain text, no colour or other styles (https://no-color.org)",
    "FORCE_COLOR": "set: styles even when the output is not a terminal",
    "TERM": "dumb: no live status line",
    "COLUMNS": "the terminal's width, when it cannot be asked",
    "PAGER": "pager for a long diff at fix's confirmation; default `less -R -F -X`",
    "CLOVER_GIT_MIRROR": "eval: a folder of mirrors; an https git source is read from DIR/owner/name.git "
    "(also --git-mirror)",
    "CLOVER_GIT_TIMEOUT": "eval: seconds a git source's fetch may take; default 1800 (also --git-timeout)",
}
#: The variables that locate the Docker engine and bound its calls (handed to the Docker sandbox,
#: never into it).
DOCKER_VARIABLES = ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH", "CLOVER_DOCKER_TIMEOUT")
#: The repository's own configuration file.
REPO_CONFIG = Path(".clover") / "config.toml"


def _home_default(env: Mapping[str, str]) -> Path:
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "clover-agent"


def _state_default(env: Mapping[str, str]) -> Path:
    return Path(env.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "clover-agent"


@dataclass(frozen=True)
class Settings:
    """User settings: environment first, then the config file, then defaults."""

    config_path: Path
    model_path: str | None = None  # the config file's [model] path
    model_from_env: str | None = None  # CLOVER_MODEL
    home: Path = field(default_factory=lambda: _home_default(os.environ))
    #: What is this user's alone (not a cache): the record key, the trusted repositories.
    state: Path = field(default_factory=lambda: _state_default(os.environ))
    sandbox_image: str = DEFAULT_SANDBOX_IMAGE  # CLOVER_SANDBOX_IMAGE, else the config file's
    base_url: str | None = None
    api_key: str | None = None
    serve_api_key: str | None = None  # CLOVER_API_KEY only: the key `clover-agent serve` requires
    #: CLOVER_CUDA_GRAPHS, else the config file's [model] cuda_graphs; None: the engine's default
    #: (replayed as CUDA graphs on a CUDA device).
    cuda_graphs: bool | None = None
    #: CLOVER_EXPERTS, else the config file's [model] experts: how the engine holds the routed experts
    #: (None: as stored). Checked against the loader's choices where a backend is built
    #: (``launch.check_backend_options``, ``EngineBackend``); ``experts_from`` names where it was set.
    experts: str | None = None
    experts_from: str = ""
    #: CLOVER_EXPERTS_ON, else the config file's [model] experts_on: where the engine puts the routed
    #: experts (None: on the device); checked as ``experts`` is, ``experts_on_from`` names where it was set.
    experts_on: str | None = None
    experts_on_from: str = ""
    hf_hub_cache: Path = field(default_factory=lambda: Path.home() / ".cache" / "huggingface" / "hub")
    #: The process environment, for what runs on this machine on the user's behalf (the local
    #: sandbox's commands) and for the Docker engine's address (:data:`DOCKER_VARIABLES`).
    environment: Mapping[str, str] = field(default_factory=dict)
    #: The config file's ``[mcp_servers.NAME]`` tables as written (``clover_agent.tools.mcp`` reads
    #: them: command, args, env or url, where, approve).
    mcp_servers: Mapping[str, Any] = field(default_factory=dict)
    #: The config file's ``[[hooks.EVENT]]`` tables as written (``clover_agent.hooks`` reads them).
    hooks: Mapping[str, Any] = field(default_factory=dict)

    @property
    def vocab_cache(self) -> Path:
        """Where the converted real vocabulary is kept (``clover_agent.engine.text.vocab``)."""
        return self.home / "vocab"

    @property
    def record_key_path(self) -> Path:
        """The key run records are signed with (:mod:`clover_agent.agent.records`)."""
        return self.state / "record.key"

    @property
    def trust_file(self) -> Path:
        """The repositories whose ``.clover/config.toml`` the user trusts (:func:`set_trust`)."""
        return self.state / "trusted-repos.json"

    @property
    def docker_env(self) -> dict[str, str]:
        """The variables that locate the Docker engine (none set: the default socket) and bound its
        calls."""
        return {name: self.environment[name] for name in DOCKER_VARIABLES if self.environment.get(name)}

    @classmethod
    def load(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read ``environ`` (default: this process's environment) and the user's config file.
        Raises :class:`UsageError` naming the file and the setting when the file is not valid."""
        env = dict(os.environ if environ is None else environ)
        path = _config_path(env)
        values = _read_toml(path) if path.is_file() else {}

        def text(table: str | None, key: str) -> str | None:
            """The string at ``[table] key`` (a top-level key when ``table`` is None), if set."""
            return _string(values, table, key, path)

        home = env.get("CLOVER_HOME") or text(None, "home")
        state = env.get("CLOVER_STATE")
        hub = env.get("HF_HUB_CACHE")
        hf_home = env.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
        graphs = env.get("CLOVER_CUDA_GRAPHS")
        return cls(
            config_path=path,
            model_path=text("model", "path"),
            model_from_env=env.get("CLOVER_MODEL") or None,
            home=Path(home).expanduser() if home else _home_default(env),
            state=Path(state).expanduser().absolute() if state else _state_default(env),
            sandbox_image=env.get("CLOVER_SANDBOX_IMAGE")
            or text("sandbox", "image")
            or DEFAULT_SANDBOX_IMAGE,
            base_url=env.get("CLOVER_BASE_URL") or text("openai", "base_url"),
            api_key=env.get("CLOVER_API_KEY") or env.get("OPENAI_API_KEY"),
            serve_api_key=env.get("CLOVER_API_KEY") or None,
            cuda_graphs=_switch(graphs, "CLOVER_CUDA_GRAPHS")
            if graphs
            else _boolean(values, "model", "cuda_graphs", path),
            experts=env.get("CLOVER_EXPERTS") or text("model", "experts"),
            experts_from="CLOVER_EXPERTS" if env.get("CLOVER_EXPERTS") else f"{path}: [model] experts",
            experts_on=env.get("CLOVER_EXPERTS_ON") or text("model", "experts_on"),
            experts_on_from="CLOVER_EXPERTS_ON"
            if env.get("CLOVER_EXPERTS_ON")
            else f"{path}: [model] experts_on",
            hf_hub_cache=Path(hub).expanduser() if hub else Path(hf_home).expanduser() / "hub",
            environment=env,
            mcp_servers=_tables(values, "mcp_servers", path),
            hooks=_hook_tables(values, path),
        )


#: The ``[sandbox]`` keys a repository's file may set only once the user trusts that file for that
#: repository (:func:`trusted_digest`): they run commands (with the network), choose the image,
#: add packages or name a folder copied into the environment. Untrusted, they are ignored; the
#: other keys only choose among what the project itself declares (its extras, dependency groups,
#: tracked requirement files) or how the run is checked (``[fix]``), and always apply.
TRUSTED_ONLY = ("setup", "setup_network", "image", "packages", "wheels")


@dataclass(frozen=True)
class RepoSettings:
    """The ``[sandbox]`` and ``[fix]`` tables of a repository's ``.clover/config.toml``.

    ```toml
    [sandbox]
    image = "my-project-sandbox:latest"   # build it FROM clover-agent-sandbox:latest
    environment = "auto"                  # "none": no project environment, the image as it is
    extras = ["test"]                     # instead of the extras found (also dependency_groups,
    requirements = ["ci/requirements.txt"]  # requirements: instead of the files found)
    packages = ["pytest-timeout"]         # more requirements for the environment
    install_project = true                # false: do not pip install -e . the project
    setup = ["make generated-files"]      # run after the install (in the environment, cached with it)
    setup_network = true                  # false: no network for the set-up (needs wheels)
    wheels = "wheelhouse"                 # a folder of wheels/sdists (pip download -d), offered to pip
    compiler = true                       # start from the image's compiler variant (gcc, python3-dev)
    installer = "uv"                      # default; "pip": set the environment up with pip

    [fix]
    regression = "suite"                  # or "related" / "none": what the regression runs cover
    suite_timeout = 1800                  # seconds per run of the whole suite (default 600)
    test_timeout = 300                    # seconds per test (default: a fifth of suite_timeout)
    ```

    The keys of :data:`TRUSTED_ONLY` are used only when the file is trusted; ``ignored`` names
    those the file sets and that were left out because it is not. ``compiler`` is not one of them:
    it chooses between two images clover-agent builds from its own recipes; nor is ``installer``:
    it chooses which of the image's two installers installs what the other keys name.
    """

    image: str | None = None
    setup: list[str] = field(default_factory=list)
    #: None: the environment's set-up has the network, plain set-up commands do not.
    setup_network: bool | None = None
    environment: bool = True
    extras: tuple[str, ...] | None = None
    dependency_groups: tuple[str, ...] | None = None
    requirements: tuple[str, ...] | None = None
    packages: tuple[str, ...] = ()
    install_project: bool | None = None
    wheels: str | None = None  # resolved, inside the repository
    compiler: bool = False
    installer: str = DEFAULT_INSTALLER  # "uv" (pip the fallback) or "pip"
    regression: str | None = None
    suite_timeout: float | None = None
    test_timeout: float | None = None
    #: ``[mcp_servers.NAME]`` tables as written: only from a trusted file (they run programs).
    mcp_servers: Mapping[str, Any] = field(default_factory=dict)
    #: ``[[hooks.EVENT]]`` tables as written: only from a trusted file (they run commands on the host).
    hooks: Mapping[str, Any] = field(default_factory=dict)
    ignored: tuple[str, ...] = ()  # TRUSTED_ONLY keys the file sets, left out: it is not trusted


def repo_settings(repo: str | Path, *, trusted: bool = False) -> RepoSettings:
    """The repository's settings (empty when it has no ``.clover/config.toml``); a broken file is a
    :class:`UsageError` naming it and what is wrong. Not ``trusted``: the :data:`TRUSTED_ONLY` keys
    are left out (named in ``ignored``). Trusted, ``wheels`` must still be a folder inside the
    repository (no ``~``, no path or symlink leading out): only ``--wheels`` names one elsewhere."""
    path = Path(repo) / REPO_CONFIG
    if not path.is_file():
        return RepoSettings()
    values = _repo_values(path)
    table, fix = values.get("sandbox", {}), values.get("fix", {})
    for name, t in (("sandbox", table), ("fix", fix)):
        if not isinstance(t, dict):
            raise UsageError(f"{path}: [{name}] must be a table")

    def check(
        key: str, kind: type | tuple[type, ...], what: str, default: Any = None, where: str = "sandbox"
    ) -> Any:
        value = (table if where == "sandbox" else fix).get(key, default)
        if value is not None and not isinstance(value, kind):
            raise UsageError(f"{path}: [{where}] {key} must be {what}")
        return value

    def strings(key: str) -> tuple[str, ...] | None:
        value = check(key, list, "a list of strings")
        if value is not None and not all(isinstance(v, str) for v in value):
            raise UsageError(f"{path}: [sandbox] {key} must be a list of strings")
        return None if value is None else tuple(value)

    environment = check("environment", str, '"auto" or "none"', "auto")
    if environment not in ("auto", "none"):
        raise UsageError(f'{path}: [sandbox] environment must be "auto" or "none" (got {environment!r})')
    choices = " or ".join(f'"{name}"' for name in INSTALLERS)
    installer = check("installer", str, choices, DEFAULT_INSTALLER)
    if installer not in INSTALLERS:
        raise UsageError(f"{path}: [sandbox] installer must be {choices} (got {installer!r})")
    regression = check("regression", str, '"suite", "related" or "none"', where="fix")
    if regression is not None and regression not in ("suite", "related", "none"):
        raise UsageError(
            f'{path}: [fix] regression must be "suite", "related" or "none" (got {regression!r})'
        )
    for key in ("suite_timeout", "test_timeout"):
        value = fix.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0
        ):
            raise UsageError(f"{path}: [fix] {key} must be a number of seconds above 0")
    suite_timeout, test_timeout = fix.get("suite_timeout"), fix.get("test_timeout")
    wheels = check("wheels", str, "a folder path")
    settings = RepoSettings(
        image=check("image", str, "a string"),
        setup=list(strings("setup") or ()),
        setup_network=check("setup_network", bool, "true or false"),
        environment=environment == "auto",
        extras=strings("extras"),
        dependency_groups=strings("dependency_groups"),
        requirements=strings("requirements"),
        packages=strings("packages") or (),
        install_project=check("install_project", bool, "true or false"),
        wheels=None if wheels is None or not trusted else _folder_inside(Path(repo), wheels, path),
        compiler=check("compiler", bool, "true or false", False),
        installer=installer,
        regression=regression,
        suite_timeout=None if suite_timeout is None else float(suite_timeout),
        test_timeout=None if test_timeout is None else float(test_timeout),
        mcp_servers=_tables(values, "mcp_servers", path),
        hooks=_hook_tables(values, path),
    )
    if trusted:
        return settings
    ignored = tuple(key for key in TRUSTED_ONLY if key in table)
    ignored += ("mcp_servers",) if settings.mcp_servers else ()
    ignored += ("hooks",) if settings.hooks else ()
    empty = RepoSettings()
    return replace(
        settings,
        **{key: getattr(empty, key) for key in TRUSTED_ONLY},
        mcp_servers={},
        hooks={},
        ignored=ignored,
    )


def trusted_only_values(repo: str | Path) -> dict[str, Any]:
    """What the repository's file sets that needs trust, with the values as written: the
    :data:`TRUSTED_ONLY` keys of ``[sandbox]`` by name, each ``[mcp_servers.NAME]`` table as
    ``mcp_servers.NAME``, and each event's hooks as ``hooks.EVENT``."""
    path = Path(repo) / REPO_CONFIG
    values = _repo_values(path) if path.is_file() else {}
    table = values.get("sandbox", {})
    found = {key: table[key] for key in TRUSTED_ONLY if isinstance(table, dict) and key in table}
    servers = values.get("mcp_servers", {})
    if isinstance(servers, dict):
        found |= {f"mcp_servers.{name}": server for name, server in servers.items()}
    hooks = values.get("hooks", {})
    if isinstance(hooks, dict):
        found |= {f"hooks.{event}": entries for event, entries in hooks.items()}
    return found


def _repo_values(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: invalid TOML: {exc}") from exc


def _folder_inside(repo: Path, value: str, path: Path) -> str:
    """``value`` (a repository file's folder) resolved, refused unless it lies inside ``repo``."""
    root = repo.resolve()
    folder = (root / value).resolve()
    if value.startswith("~") or not folder.is_relative_to(root):
        raise UsageError(
            f"{path}: [sandbox] wheels = {value!r} is outside the repository: a repository's file may only "
            "name a folder inside it (no ~, no absolute path or symlink leading out); give a folder "
            "elsewhere with --wheels DIR"
        )
    return str(folder)


def config_digest(repo: str | Path) -> str | None:
    """The SHA-256 of the repository's ``.clover/config.toml`` (None: it has none)."""
    path = Path(repo) / REPO_CONFIG
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
    except OSError as exc:
        raise UsageError(f"{path}: cannot be read ({exc.strerror})") from None


def _trust_table(settings: Settings) -> dict[str, str]:
    try:
        data = json.loads(settings.trust_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"{settings.trust_file}: not a readable list of trusted repositories ({exc})"
        ) from None
    repos = data.get("repos") if isinstance(data, dict) else None
    if not isinstance(repos, dict):
        raise UsageError(f'{settings.trust_file}: not a list of trusted repositories (no "repos" table)')
    return {str(k): str(v) for k, v in repos.items()}


def trusted_digest(settings: Settings, repo: str | Path) -> str | None:
    """The digest of the repository's ``.clover/config.toml`` the user trusts (None: none is): the
    file is trusted when it is the one its digest names."""
    return _trust_table(settings).get(str(Path(repo).resolve()))


def set_trust(settings: Settings, repo: str | Path, digest: str | None) -> None:
    """Record that the user trusts the file of ``digest`` for ``repo`` (None: trusts none of it)."""
    table = _trust_table(settings)
    key = str(Path(repo).resolve())
    if digest is None:
        table.pop(key, None)
    else:
        table[key] = digest
    settings.state.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = settings.trust_file.with_name(settings.trust_file.name + ".tmp")
    temporary.write_text(json.dumps({"version": 1, "repos": table}, indent=2) + "\n", encoding="utf-8")
    temporary.replace(settings.trust_file)


def _config_path(env: Mapping[str, str]) -> Path:
    explicit = env.get("CLOVER_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "clover-agent" / "config.toml"


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{path}: not a readable TOML file ({exc})") from exc


def _tables(values: dict[str, Any], key: str, path: Path) -> dict[str, Any]:
    """``[key.NAME]`` tables (``{}`` when there are none); anything else at ``key`` is refused."""
    found = values.get(key, {})
    if not isinstance(found, dict) or not all(isinstance(v, dict) for v in found.values()):
        raise UsageError(f"{path}: {key} must hold tables, one per name ([{key}.NAME])")
    return found


def _hook_tables(values: dict[str, Any], path: Path) -> dict[str, Any]:
    """The ``[hooks]`` table: event names to lists of tables (``clover_agent.hooks`` checks them)."""
    found = values.get("hooks", {})
    if not isinstance(found, dict) or not all(isinstance(v, list) for v in found.values()):
        raise UsageError(f"{path}: hooks must hold a list of tables per event ([[hooks.EVENT]])")
    return found


def _switch(text: str, name: str) -> bool:
    """An on/off environment variable: 1/true/yes/on or 0/false/no/off (any case)."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise UsageError(f"{name}={text!r}: use 1 or 0 (true/false, yes/no, on/off)")


def _boolean(values: dict[str, Any], table: str, key: str, path: Path) -> bool | None:
    section = values.get(table, {})
    if not isinstance(section, dict):
        raise UsageError(f"{path}: {table} must be a table ([{table}])")
    value = section.get(key)
    if value is not None and not isinstance(value, bool):
        raise UsageError(f"{path}: [{table}] {key} must be true or false (got {value!r})")
    return value


def _string(values: dict[str, Any], table: str | None, key: str, path: Path) -> str | None:
    section = values if table is None else values.get(table, {})
    if not isinstance(section, dict):
        raise UsageError(f"{path}: {table} must be a table ([{table}])")
    value = section.get(key)
    if value is not None and not isinstance(value, str):
        where = key if table is None else f"[{table}] {key}"
        raise UsageError(f"{path}: {where} must be a string (got {value!r})")
    return value


#: pip's settings that decide where the environment set-up finds packages (``pip config`` names).
PIP_SETTINGS = (
    "index-url",
    "extra-index-url",
    "find-links",
    "trusted-host",
    "cert",
    "proxy",
    "timeout",
    "default-timeout",
    "retries",
    "no-index",
)
#: pip settings the set-up's own ``pip.conf`` sets (to the same effect, or as the sandbox needs).
PIP_SET_IN_SANDBOX = ("disable-pip-version-check", "no-input", "progress-bar", "no-cache-dir")
#: ``PIP_*`` variables that are not settings (``PIP_CONFIG_FILE`` names the file read here).
_PIP_NOT_SETTINGS = ("PIP_CONFIG_FILE",)
_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")


def pip_config_files(environ: Mapping[str, str], etc: Path = Path("/etc")) -> list[Path]:
    """The files this machine's pip reads, lowest precedence first (as ``pip config debug`` lists
    them: global, user, site; ``PIP_CONFIG_FILE`` last, and instead of the user's files)."""
    xdg_dirs = (environ.get("XDG_CONFIG_DIRS") or str(etc / "xdg")).split(":")
    files = [Path(d) / "pip" / "pip.conf" for d in xdg_dirs if d] + [etc / "pip.conf"]
    explicit = environ.get("PIP_CONFIG_FILE")
    if not (explicit and Path(explicit).exists()):
        home = Path(environ.get("HOME") or Path.home())
        files += [
            home / ".pip" / "pip.conf",
            Path(environ.get("XDG_CONFIG_HOME") or home / ".config") / "pip" / "pip.conf",
        ]
    if environ.get("VIRTUAL_ENV"):
        files.append(Path(environ["VIRTUAL_ENV"]) / "pip.conf")
    if explicit and explicit != os.devnull:
        files.append(Path(explicit))
    return files


def _pip_install_sections(environ: Mapping[str, str], etc: Path) -> list[tuple[Path, list[tuple[str, str]]]]:
    """Each readable pip config file (in pip's order) with its ``[global]`` then ``[install]``
    keys and values, keys spelled with dashes; a file that cannot be read or parsed is left out."""
    import configparser

    found = []
    for path in pip_config_files(environ, etc):
        parser = configparser.RawConfigParser()
        try:
            parser.read(path, encoding="utf-8")
        except (OSError, configparser.Error):
            continue
        pairs = [
            (key.replace("_", "-"), value)
            for section in ("global", "install")
            if parser.has_section(section)
            for key, value in parser.items(section)
        ]
        found.append((path, pairs))
    return found


def pip_configuration(environ: Mapping[str, str], etc: Path = Path("/etc")) -> dict[str, str]:
    """pip's :data:`PIP_SETTINGS` for ``pip install`` as this machine's pip would use them: the
    config files' ``[global]`` then ``[install]`` sections, then ``PIP_*`` variables
    (``default-timeout`` is pip's other name for ``timeout``)."""

    def name(key: str) -> str:
        return "timeout" if key == "default-timeout" else key

    values: dict[str, str] = {}
    for _path, pairs in _pip_install_sections(environ, etc):
        for key, value in pairs:
            if key in PIP_SETTINGS:
                values[name(key)] = value
    for key in PIP_SETTINGS:
        variable = environ.get("PIP_" + key.replace("-", "_").upper())
        if variable:
            values[name(key)] = variable
    return values


def pip_settings_left_out(environ: Mapping[str, str], etc: Path = Path("/etc")) -> list[str]:
    """Notes naming the settings of this machine's pip configuration for ``pip install`` (its
    files' ``[global]`` and ``[install]`` sections, ``PIP_*`` variables) that the sandbox's
    set-up does not carry: which keys, from which file or variable; never their values."""
    carried = set(PIP_SETTINGS) | set(PIP_SET_IN_SANDBOX)
    notes = []
    for path, pairs in _pip_install_sections(environ, etc):
        left = [k for k in dict.fromkeys(key for key, _value in pairs) if k not in carried]
        if left:
            notes.append(
                f"pip's {', '.join(left)} (in {path}): not carried into the sandbox's set-up, left out"
            )
    variables = [
        name
        for name, value in sorted(environ.items())
        if name.startswith("PIP_")
        and value
        and name not in _PIP_NOT_SETTINGS
        and name[4:].lower().replace("_", "-") not in carried
    ]
    if variables:
        notes.append(f"the variables {', '.join(variables)}: not carried into the sandbox's set-up, left out")
    return notes


def host_package_index(environ: Mapping[str, str], etc: Path = Path("/etc")) -> PackageIndex:
    """The package index as this machine's pip is configured to reach it, in the form the
    sandbox's environment set-up can use: remote URLs carried, the CA bundle's content copied
    (pip's ``cert``, else ``REQUESTS_CA_BUNDLE`` / ``SSL_CERT_FILE``), the proxy variables kept.
    Host folders and ``file://`` indexes do not exist in the sandbox: they are left out, and
    :attr:`PackageIndex.notes` says so."""
    values = pip_configuration(environ, etc)
    notes: list[str] = []

    def remote(key: str) -> tuple[str, ...]:
        kept = []
        for url in values.get(key, "").split():
            if url.startswith(("http://", "https://")):
                kept.append(url)
            else:
                notes.append(
                    f"pip's {key} {without_credentials(url)} is on this machine, not in the sandbox: left "
                    "out (to install from "
                    'a folder, name it with `wheels = "DIR"` in .clover/config.toml or --wheels DIR)'
                )
        return tuple(kept)

    index = remote("index-url")
    ca_bundle = None
    cert = values.get("cert") or environ.get("REQUESTS_CA_BUNDLE") or environ.get("SSL_CERT_FILE")
    if cert:
        try:
            ca_bundle = Path(cert).expanduser().read_bytes()
        except OSError as exc:
            notes.append(f"the CA bundle {cert} cannot be read ({exc.strerror}): left out")
    if values.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        notes.append("pip is set to no-index here; the sandbox's set-up uses the index anyway")
    notes += pip_settings_left_out(environ, etc)
    return PackageIndex(
        index_url=index[0] if index else None,
        extra_index_urls=remote("extra-index-url"),
        find_links=remote("find-links"),
        trusted_hosts=tuple(values.get("trusted-host", "").split()),
        ca_bundle=ca_bundle,
        proxy=values.get("proxy") or None,
        proxy_env=tuple((k, environ[k]) for k in _PROXY_VARIABLES if environ.get(k)),
        timeout=values.get("timeout"),
        retries=values.get("retries"),
        notes=tuple(notes),
    )
