"""What a front end builds before a run, from its options and the settings: the model backend (as a
factory, so nothing loads before it is needed) and the complete sandbox spec.

``clover-agent fix``, the TUI and the CI bot share these, so a backend option or a sandbox setting
means the same in each. :class:`~clover_agent.settings.Settings` is loaded once by the front end
and passed in; nothing here reads the environment.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from clover_agent.backends import BACKEND_KINDS, create_backend
from clover_agent.backends.base import ModelBackend
from clover_agent.engine.loading.locate import ModelSources
from clover_agent.environments.python_deps import EnvironmentOptions, discover
from clover_agent.errors import UsageError
from clover_agent.hooks import HookConfig, parse_hooks
from clover_agent.sandboxes.base import SandboxLimits, SandboxSpec
from clover_agent.settings import REPO_CONFIG, RepoSettings, Settings, host_package_index, repo_settings
from clover_agent.tools.mcp import McpServerConfig, parse_servers

BackendFactory = Callable[[], ModelBackend]


@dataclass(frozen=True)
class BackendOptions:
    """The backend a user chose: ``kind`` (engine, openai, replay) and its options as given on the
    command line (None: the settings' value or the backend's default)."""

    kind: str = "engine"
    model: str | None = None  # engine: the weights folder (--model)
    base_url: str | None = None  # openai: the server's API root (--base-url)
    model_name: str | None = None  # openai: the model name sent to the server (--model-name)
    replay: str | None = None  # replay: the JSON Lines file of recorded turns (--replay)
    replay_start: int = 0  # replay: turns of the file already used (a resumed run continues after them)
    engine_options: dict[str, Any] = field(default_factory=dict)  # more EngineBackend keywords


def model_sources(settings: Settings, explicit: str | None = None) -> ModelSources:
    """Where the engine looks for the weights: ``explicit`` (--model), then the settings."""
    return ModelSources(
        explicit=explicit,
        from_env=settings.model_from_env,
        configured=settings.model_path,
        hf_hub_cache=settings.hf_hub_cache,
    )


def check_backend_options(options: BackendOptions, settings: Settings) -> BackendOptions:
    """:class:`UsageError` for a choice that cannot work, before any sandbox or test run starts:
    a replay without its file, an openai backend without a server; for the engine, the readiness
    check (a GPU with room for the weights, or a small checkpoint on the CPU), which fails within
    seconds with the ways forward (:class:`~clover_agent.backends.BackendUnavailable`).

    Returns ``options`` with what the settings chose filled in (the engine's checkpoint folder, the
    openai server): what a run records, so resuming it elsewhere (another shell, without
    ``CLOVER_MODEL`` or ``CLOVER_BASE_URL``) uses the same model."""
    if options.kind not in BACKEND_KINDS:
        raise UsageError(f"unknown backend {options.kind!r}; choose one of: {', '.join(BACKEND_KINDS)}")
    if options.kind == "replay" and not options.replay:
        raise UsageError("--backend replay needs --replay FILE (JSON Lines of recorded assistant turns)")
    if options.replay and not Path(options.replay).is_file():
        raise UsageError(f"--replay {options.replay}: no such file")
    if options.kind == "openai":
        if not (options.base_url or settings.base_url):
            raise UsageError("--backend openai needs --base-url URL (or CLOVER_BASE_URL)")
        return replace(options, base_url=options.base_url or settings.base_url)
    if options.kind == "engine":
        from clover_agent.backends.engine import choose_device  # loads the engine's modules

        experts = engine_experts(options, settings)
        folder, _ = choose_device(
            model_sources(settings, options.model), experts, engine_experts_on(options, settings)
        )
        return replace(options, model=options.model or str(folder))
    return options


def engine_experts(options: BackendOptions, settings: Settings) -> str:
    """How the engine holds the routed experts: the front end's own option, else CLOVER_EXPERTS or
    ``[model] experts``, else "auto" (as stored)."""
    from clover_agent.backends.engine import EXPERT_CHOICES

    return _engine_choice(options, "experts", settings.experts, settings.experts_from, EXPERT_CHOICES, "auto")


def engine_experts_on(options: BackendOptions, settings: Settings) -> str:
    """Where the engine puts the routed experts: the front end's own option, else CLOVER_EXPERTS_ON
    or ``[model] experts_on``, else "device"."""
    from clover_agent.backends.engine import EXPERT_PLACES

    return _engine_choice(
        options, "experts_on", settings.experts_on, settings.experts_on_from, EXPERT_PLACES, "device"
    )


def _engine_choice(
    options: BackendOptions,
    key: str,
    setting: str | None,
    setting_from: str,
    choices: tuple[str, ...],
    default: str,
) -> str:
    """``options.engine_options[key]``, else the setting, else ``default``; :class:`UsageError`
    naming where it came from for a value the loader does not have."""
    chosen = options.engine_options.get(key)
    value, where = (str(chosen), key) if chosen is not None else (setting, setting_from)
    if value is None:
        return default
    if value not in choices:
        raise UsageError(f"{where} = {value!r}: choose one of {', '.join(choices)}")
    return value


async def probe_backend(options: BackendOptions, settings: Settings) -> None:
    """That the backend will answer, before a front end does any work for it (``fix``: before the
    sandbox and the tests): a replay file's every line read as the backend reads them; a server
    reached, serving the model (:meth:`ModelBackend.check`). The engine was checked by
    :func:`check_backend_options`."""
    if options.kind == "replay" and options.replay:
        from clover_agent.backends.replay import load_replay

        load_replay(Path(options.replay))
    if options.kind == "openai":
        backend = backend_factory(options, settings)()
        try:
            await backend.check()
        finally:
            await backend.close()


def backend_factory(options: BackendOptions, settings: Settings) -> BackendFactory:
    """A function making the chosen backend when called (a front end calls it only once the
    backend is needed: ``fix`` after the failure is confirmed)."""

    def make() -> ModelBackend:
        if options.kind == "replay":
            return create_backend("replay", path=options.replay, start=options.replay_start)
        if options.kind == "openai":
            values: dict[str, Any] = {
                "base_url": options.base_url or settings.base_url,
                "api_key": settings.api_key,
            }
            if options.model_name:
                values["model_name"] = options.model_name
            return create_backend("openai", **values)
        engine_options = dict(options.engine_options)
        if settings.cuda_graphs is not None:
            engine_options.setdefault("cuda_graphs", settings.cuda_graphs)
        engine_options["experts"] = engine_experts(options, settings)
        engine_options["experts_on"] = engine_experts_on(options, settings)
        return create_backend("engine", sources=model_sources(settings, options.model), **engine_options)

    return make


def sandbox_spec(
    settings: Settings,
    repo: str | Path,
    *,
    image: str | None = None,
    limits: SandboxLimits | None = None,
    network: bool = False,
    env: dict[str, str] | None = None,
    host_env: dict[str, str] | None = None,
    environment: bool = False,
    wheels: str | None = None,
    compiler: bool = False,
    repo_config: RepoSettings | None = None,
    progress: Callable[[str], None] | None = None,
) -> SandboxSpec:
    """The complete spec for a sandbox over ``repo``: the image, the repository's set-up, and the host
    environment.

    - ``image``: else the repository's ``.clover/config.toml``, else the settings'.
    - ``host_env``: default this process's, as the settings read it (a CI bot passes an allow-list).
    - ``wheels``: a folder of wheels for the environment (e.g. ``--wheels``; else the repository's).
    - ``compiler``: the Docker sandbox starts from the image's compiler variant (e.g. ``--with-compiler``;
      else the repository's ``compiler``).

    ``environment`` (the front ends pass it for the Docker sandbox): the project's environment, found
    from its files and the repository's file (``[sandbox] environment = "none"`` turns it off), installed
    with this machine's package-index configuration and ``wheels``. The repository's set-up commands then
    run in it and are cached with it; without one they run in each sandbox before the agent.

    ``repo_config``: the repository's settings as the front end trusted them. The default is its file
    untrusted, so without its set-up commands, image, packages or wheels.

    A broken repository file is a :class:`UsageError`; dependency files that cannot be read are a
    :class:`~clover_agent.sandboxes.errors.SandboxSetupError`.
    """
    repo_config = repo_settings(repo) if repo_config is None else repo_config
    host = dict(settings.environment if host_env is None else host_env)
    recipe = None
    if environment and repo_config.environment:
        options = EnvironmentOptions(
            install_project=repo_config.install_project,
            extras=repo_config.extras,
            groups=repo_config.dependency_groups,
            requirements=repo_config.requirements,
            packages=repo_config.packages,
            setup=tuple(repo_config.setup),
            wheels=str(Path(wheels).resolve()) if wheels else repo_config.wheels,
            network=repo_config.setup_network is not False,
            index=host_package_index(host),
            installer=repo_config.installer,
        )
        recipe = discover(repo, options)
    return SandboxSpec(
        repo=str(repo),
        image=image or repo_config.image or settings.sandbox_image,
        limits=limits or SandboxLimits(),
        network=network,
        setup_commands=[] if recipe is not None else list(repo_config.setup),
        setup_network=bool(repo_config.setup_network),
        env=dict(env or {}),
        host_env=host,
        environment=recipe,
        compiler=compiler or repo_config.compiler,
        progress=progress,
    )


def mcp_servers(settings: Settings, repo: Path, configured: RepoSettings) -> tuple[McpServerConfig, ...]:
    """The MCP servers of the user's config file, then those of the repository's file (only as far as
    :func:`repo_config_of` trusted it) that the user's does not name. A bad table is a
    :class:`UsageError` naming the file."""
    found: dict[str, McpServerConfig] = {}
    for tables, origin, path in (
        (settings.mcp_servers, "settings", settings.config_path),
        (configured.mcp_servers, "repository", repo / REPO_CONFIG),
    ):
        try:
            servers = parse_servers(tables, origin=origin)
        except ValueError as exc:
            raise UsageError(f"{path}: {exc}") from None
        for server in servers:
            found.setdefault(server.name, server)
    return tuple(found.values())


def hooks_of(settings: Settings, repo: Path, configured: RepoSettings) -> tuple[HookConfig, ...]:
    """The hooks of the user's config file, then those of the repository's file (only as far as
    the front end trusted it: an untrusted file's hooks are never read). A bad table is a
    :class:`UsageError` naming the file."""
    found: list[HookConfig] = []
    for tables, origin, path in (
        (settings.hooks, "settings", settings.config_path),
        (configured.hooks, "repository", repo / REPO_CONFIG),
    ):
        try:
            found += parse_hooks(tables, origin=origin)
        except ValueError as exc:
            raise UsageError(f"{path}: {exc}") from None
    return tuple(found)
