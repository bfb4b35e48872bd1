"""The installer of a project's environment: uv's pip interface by default, pip when chosen in
``.clover/config.toml`` (``[sandbox] installer``) and as each uv step's fallback; the host's
package-index settings carried to uv as its variables. The set-ups themselves, for real, are in
tests/sandboxes/test_env_installer.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from clover_agent.environments.python_deps import EnvironmentOptions, discover
from clover_agent.environments.recipe import CA_PATH, VENV, WHEELS_PATH, PackageIndex
from clover_agent.errors import UsageError
from clover_agent.launch import sandbox_spec
from clover_agent.settings import Settings, host_package_index, repo_settings

PYPROJECT = (
    '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n'
    '[project]\nname = "demo"\nversion = "1.0"\ndynamic = ["optional-dependencies"]\n'
)


def project(root: Path, config: str | None = None) -> Path:
    root.mkdir()
    (root / "pyproject.toml").write_text(PYPROJECT)
    (root / "demo.py").write_text("X = 1\n")
    if config is not None:
        (root / ".clover").mkdir()
        (root / ".clover" / "config.toml").write_text(config)
    return root


def test_the_installer_is_uv_unless_the_file_chooses_pip_and_a_bad_value_names_the_file_and_key(
    tmp_path: Path,
) -> None:
    assert repo_settings(project(tmp_path / "none")).installer == "uv"
    assert repo_settings(project(tmp_path / "other", "[sandbox]\ncompiler = true\n")).installer == "uv"
    chosen = project(tmp_path / "pip", '[sandbox]\ninstaller = "pip"\n')
    assert repo_settings(chosen).installer == "pip"  # untrusted too: it chooses among our two
    assert repo_settings(chosen, trusted=True).installer == "pip"
    bad = project(tmp_path / "bad", '[sandbox]\ninstaller = "poetry"\n')
    with pytest.raises(UsageError) as caught:
        repo_settings(bad)
    text = str(caught.value)
    assert str(bad / ".clover" / "config.toml") in text and "[sandbox] installer" in text
    assert '"uv" or "pip"' in text and "'poetry'" in text
    with pytest.raises(UsageError, match=r"\[sandbox\] installer must be"):
        repo_settings(project(tmp_path / "number", "[sandbox]\ninstaller = 3\n"))
    # the launch's spec carries the choice into the recipe
    settings = Settings.load({"CLOVER_CONFIG": str(tmp_path / "no-config.toml")})
    spec = sandbox_spec(settings, chosen, environment=True, host_env={})
    assert spec.environment is not None and spec.environment.installer == "pip"
    assert spec.environment.steps[0].command.startswith("python -m pip install ")
    spec = sandbox_spec(settings, tmp_path / "none", environment=True, host_env={})
    assert spec.environment is not None and spec.environment.installer == "uv"


def test_uv_steps_carry_their_pip_form_and_the_installer_changes_the_cache_key(tmp_path: Path) -> None:
    repo = project(tmp_path / "demo")
    uv = discover(repo, EnvironmentOptions())
    pip = discover(repo, EnvironmentOptions(installer="pip"))
    assert uv is not None and pip is not None
    assert uv.installer == "uv" and pip.installer == "pip"
    # the project, then its extras read from its built metadata (dynamic): both steps install
    assert [s.title.split(" ", 3)[:3] for s in uv.steps] == [["uv", "pip", "install"]] * 2
    assert uv.steps[0].command == f"uv pip install --python {VENV}/bin/python -e . pytest"
    assert 'uv pip install --python /opt/clover/venv/bin/python -e ".[$extras]"; fi' in uv.steps[1].command
    assert all(s.with_pip is not None for s in uv.steps)
    # pip's form of each uv step is exactly the step a pip recipe has
    assert uv.with_installer("pip").steps == pip.steps
    assert pip.steps[0].command == "python -m pip install -e . pytest" and pip.steps[0].with_pip is None
    assert uv.cache_key("base") != pip.cache_key("base")
    assert uv.with_installer("pip").cache_key("base") == pip.cache_key("base")
    # offline, uv is told to use the wheel folder alone (pip by its pip.conf's no-index)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    offline = discover(repo, EnvironmentOptions(wheels=str(wheels), network=False))
    assert offline is not None and "--no-index" in offline.steps[0].command
    assert offline.setup_env()["UV_FIND_LINKS"] == WHEELS_PATH
    assert "UV_DEFAULT_INDEX" not in offline.setup_env()
    assert "no-index = true" in offline.pip_conf()


def test_the_hosts_index_settings_are_carried_to_uv_as_they_are_to_pip(tmp_path: Path) -> None:
    """A pip configuration file with an index, an extra index, a trusted host, find-links, a
    proxy, a timeout and retries, and a CA bundle: each reaches uv's variables (and pip.conf), and
    the notes name what neither gets."""
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nnot checked here\n-----END CERTIFICATE-----\n")
    conf = tmp_path / "pip.conf"
    conf.write_text(
        "[global]\nindex-url = https://user:secret@mirror.example/simple\n"
        "extra-index-url = https://extra.example/simple file:///srv/local\n"
        "trusted-host = extra.example mirror.example:8443\nfind-links = https://links.example/wheels\n"
        f"proxy = http://proxy.example:3128\ntimeout = 42\nretries = 7\ncert = {ca}\nno-binary = :all:\n"
    )
    index = host_package_index({"PIP_CONFIG_FILE": str(conf), "HOME": str(tmp_path)}, etc=tmp_path / "etc")
    recipe = discover(project(tmp_path / "demo"), EnvironmentOptions(index=index))
    assert recipe is not None
    env = recipe.setup_env()
    assert env["UV_DEFAULT_INDEX"] == "https://user:secret@mirror.example/simple"
    assert env["UV_EXTRA_INDEX_URL"] == "https://extra.example/simple"
    assert env["UV_INDEX_STRATEGY"] == "unsafe-best-match"  # pip's choice among several indexes
    assert env["UV_INSECURE_HOST"] == "extra.example mirror.example:8443"
    assert env["UV_FIND_LINKS"] == "https://links.example/wheels"
    assert env["HTTP_PROXY"] == env["HTTPS_PROXY"] == "http://proxy.example:3128"
    assert env["UV_HTTP_TIMEOUT"] == "42" and env["UV_HTTP_RETRIES"] == "7"
    assert env["SSL_CERT_FILE"] == CA_PATH and recipe.index.ca_bundle == ca.read_bytes()
    assert env["UV_NO_CACHE"] == env["UV_NO_CONFIG"] == env["UV_NO_SOURCES"] == "1"
    assert env["UV_LINK_MODE"] == "copy"  # its temporary cache is on another file system
    assert env["UV_COMPILE_BYTECODE"] == "1"  # as pip compiles; the sandbox cannot write bytecode
    # pip gets the same from its pip.conf
    conf_text = recipe.pip_conf()
    assert "extra-index-url = https://extra.example/simple" in conf_text
    assert "trusted-host = extra.example mirror.example:8443" in conf_text
    # what is carried to neither is named (the key, never the value)
    notes = "\n".join(index.notes)
    assert "file:///srv/local" in notes and "no-binary" in notes and ":all:" not in notes
    # the host's own proxy variables win over pip's proxy setting
    own = PackageIndex(proxy="http://pip-proxy:1", proxy_env=(("https_proxy", "http://host-proxy:2"),))
    assert "HTTPS_PROXY" not in own.uv_env(ca_path=None, offline=False)
    # pip's recipe keeps uv's variables out of its steps
    pip = discover(tmp_path / "demo", EnvironmentOptions(index=index, installer="pip"))
    assert pip is not None and not any(name.startswith("UV_") for name in pip.setup_env())
