"""The host's pip configuration as the sandbox's environment set-up receives it: pip's own files
in pip's order, ``PIP_*`` variables over them, the CA bundle's content, and nothing that only
exists on the host."""

from __future__ import annotations

from pathlib import Path

from clover_agent.settings import host_package_index, pip_config_files, pip_configuration

ETC = Path("/nonexistent-etc")


def machine(tmp_path: Path) -> dict[str, str]:
    """An environment whose pip files all live under ``tmp_path`` (global and user); the tests
    pass ``etc=ETC`` so this machine's own /etc/pip.conf is not read."""
    xdg = tmp_path / "etc-xdg"
    (xdg / "pip").mkdir(parents=True)
    (tmp_path / "home" / ".config" / "pip").mkdir(parents=True)
    return {
        "XDG_CONFIG_DIRS": str(xdg),
        "HOME": str(tmp_path / "home"),
        "XDG_CONFIG_HOME": str(tmp_path / "home" / ".config"),
    }


def test_files_in_pip_order_with_install_over_global_and_variables_over_files(tmp_path: Path) -> None:
    env = machine(tmp_path)
    (tmp_path / "etc-xdg" / "pip" / "pip.conf").write_text(
        "[global]\nindex-url = https://global.example/simple\ntimeout = 10\n"
    )
    (tmp_path / "home" / ".config" / "pip" / "pip.conf").write_text(
        "[global]\nindex_url = https://user.example/simple\n[install]\ntrusted-host = user.example\n"
        "[download]\nretries = 99\n"
    )
    assert pip_configuration(env, ETC) == {
        "index-url": "https://user.example/simple",
        "timeout": "10",
        "trusted-host": "user.example",
    }
    env["PIP_INDEX_URL"] = "https://env.example/simple"
    env["PIP_DEFAULT_TIMEOUT"] = "180"
    assert pip_configuration(env, ETC)["index-url"] == "https://env.example/simple"
    # PIP_DEFAULT_TIMEOUT is pip's --default-timeout: the same setting as the files' timeout
    assert pip_configuration(env, ETC)["timeout"] == "180"


def test_pip_config_file_replaces_the_users_files(tmp_path: Path) -> None:
    env = machine(tmp_path)
    (tmp_path / "home" / ".config" / "pip" / "pip.conf").write_text(
        "[global]\nindex-url = https://user.example/s\n"
    )
    explicit = tmp_path / "explicit.conf"
    explicit.write_text("[global]\nextra-index-url = https://extra.example/s\n")
    env["PIP_CONFIG_FILE"] = str(explicit)
    files = pip_config_files(env, ETC)
    assert files[-1] == explicit and tmp_path / "home" / ".config" / "pip" / "pip.conf" not in files
    assert pip_configuration(env, ETC) == {"extra-index-url": "https://extra.example/s"}


def test_the_package_index_carries_urls_and_the_ca_bundle_and_names_what_it_leaves_out(
    tmp_path: Path,
) -> None:
    env = machine(tmp_path)
    ca = tmp_path / "corp-ca.pem"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    (tmp_path / "etc-xdg" / "pip" / "pip.conf").write_text(
        f"[global]\ncert = {ca}\nextra-index-url = file:///opt/pypi/simple\n    https://mirror.example/simple\n"
        "find-links = /opt/wheels https://wheels.example/links/\n"
    )
    env |= {"HTTPS_PROXY": "http://proxy.example:3128", "NO_PROXY": "localhost", "PIP_RETRIES": "7"}
    index = host_package_index(env, ETC)
    assert index.ca_bundle == ca.read_bytes()
    assert index.index_url is None
    assert index.extra_index_urls == ("https://mirror.example/simple",)
    assert index.find_links == ("https://wheels.example/links/",)
    assert index.proxy_env == (("HTTPS_PROXY", "http://proxy.example:3128"), ("NO_PROXY", "localhost"))
    assert index.retries == "7"
    assert (
        len(index.notes) == 2
        and "file:///opt/pypi/simple" in index.notes[0]
        and "/opt/wheels" in index.notes[1]
    )
    conf = index.pip_conf(ca_path="/tmp/clover-setup/ca.pem", offline=False)
    assert (
        "cert = /tmp/clover-setup/ca.pem" in conf
        and "extra-index-url = https://mirror.example/simple" in conf
    )
    assert "find-links = https://wheels.example/links/" in conf and "file://" not in conf


def test_without_pip_cert_the_hosts_tls_bundle_variable_is_used_and_a_missing_one_is_named(
    tmp_path: Path,
) -> None:
    env = machine(tmp_path)
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(b"PEM")
    assert host_package_index({**env, "SSL_CERT_FILE": str(bundle)}, ETC).ca_bundle == b"PEM"
    missing = host_package_index({**env, "PIP_CERT": str(tmp_path / "gone.pem")}, ETC)
    assert missing.ca_bundle is None and "gone.pem cannot be read" in missing.notes[0]
    assert host_package_index(env, ETC).ca_bundle is None


def test_settings_not_carried_are_named_by_key_and_file_never_by_value(tmp_path: Path) -> None:
    env = machine(tmp_path)
    user = tmp_path / "home" / ".config" / "pip" / "pip.conf"
    (tmp_path / "etc-xdg" / "pip" / "pip.conf").write_text(
        "[global]\nconstraint = /etc/constraints.txt\ntimeout = 10\ndisable-pip-version-check = 1\n"
        "[download]\nonly-binary = :all:\n"
    )
    user.write_text(
        "[install]\nno_binary = :all:\nclient-cert = /home/me/secret-cert.pem\n"
        "extra-index-url = ftp://me:hunter2@files.example/simple\n"
    )
    env |= {"PIP_REQUIRE_VIRTUALENV": "true", "PIP_NO_CACHE_DIR": "1", "PIP_CONFIG_FILE": ""}
    notes = host_package_index(env, ETC).notes
    text = "\n".join(notes)
    assert (
        f"pip's constraint (in {tmp_path / 'etc-xdg' / 'pip' / 'pip.conf'}): not carried into the "
        "sandbox's set-up, left out" in notes
    )
    assert (
        f"pip's no-binary, client-cert (in {user}): not carried into the sandbox's set-up, left out" in notes
    )
    assert "the variables PIP_REQUIRE_VIRTUALENV: not carried into the sandbox's set-up, left out" in notes
    # carried (timeout), set in the sandbox as well (the version check, the cache), or not
    # pip install's (only-binary under [download]): not named; no value, no password shown
    assert "timeout" not in text and "disable-pip-version-check" not in text and "only-binary" not in text
    assert "NO_CACHE_DIR" not in text
    assert "hunter2" not in text and "secret-cert" not in text and "/etc/constraints.txt" not in text
    assert "pip's extra-index-url ftp://files.example/simple is on this machine" in text
