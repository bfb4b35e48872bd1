"""Every environment variable and user-level setting clover-agent reads, declared in one place.

Building a :class:`Settings` does no I/O beyond reading the environment and the optional TOML file.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from clover_agent.errors import UsageError

#: Tag of the sandbox image `clover-agent sandbox build` makes and the Docker sandbox uses.
DEFAULT_SANDBOX_IMAGE = "clover-agent-sandbox:latest"

ENV_VARS: dict[str, str] = {
    "CLOVER_MODEL": "folder with the Clover weights (config.json + *.safetensors)",
    "CLOVER_CONFIG": "path of the user config file (TOML); default ~/.config/clover-agent/config.toml",
    "CLOVER_HOME": "state folder (downloads, caches); default ~/.cache/clover-agent",
    "CLOVER_SANDBOX_IMAGE": f"sandbox image tag; default {DEFAULT_SANDBOX_IMAGE}",
    "OPENAI_API_KEY": "API key for --backend openai (also CLOVER_API_KEY)",
    "CLOVER_API_KEY": "API key for --backend openai, preferred over OPENAI_API_KEY",
    "CLOVER_BASE_URL": "default --base-url for --backend openai",
    "HF_HOME": "Hugging Face cache root (weights are looked up in its hub/ folder)",
    "HF_HUB_CACHE": "Hugging Face hub cache folder",
    "DOCKER_HOST": "Docker engine to use (remote hosts work)",
}


def _config_path() -> Path:
    explicit = os.environ.get("CLOVER_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "clover-agent" / "config.toml"


@dataclass(frozen=True)
class Settings:
    """User settings: environment first, then the config file, then defaults."""

    config_path: Path
    model_path: str | None = None
    home: Path = field(default_factory=lambda: Path.home() / ".cache" / "clover-agent")
    sandbox_image: str = DEFAULT_SANDBOX_IMAGE
    base_url: str | None = None
    api_key: str | None = None

    @classmethod
    def load(cls) -> Settings:
        """Raises :class:`UsageError` naming the file and the setting when the file is not valid."""
        path = _config_path()
        values: dict = {}
        if path.is_file():
            try:
                with path.open("rb") as f:
                    values = tomllib.load(f)
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise UsageError(f"{path}: not a readable TOML file ({exc})") from exc

        def text(table: str | None, key: str) -> str | None:
            """The string at ``[table] key`` (a top-level key when ``table`` is None), if set."""
            section = values if table is None else values.get(table, {})
            if not isinstance(section, dict):
                raise UsageError(f"{path}: {table} must be a table ([{table}])")
            value = section.get(key)
            if value is not None and not isinstance(value, str):
                where = key if table is None else f"[{table}] {key}"
                raise UsageError(f"{path}: {where} must be a string (got {value!r})")
            return value

        env = os.environ
        home = env.get("CLOVER_HOME") or text(None, "home") or str(Path.home() / ".cache" / "clover-agent")
        return cls(
            config_path=path,
            model_path=text("model", "path"),
            home=Path(home).expanduser(),
            sandbox_image=env.get("CLOVER_SANDBOX_IMAGE")
            or text("sandbox", "image")
            or DEFAULT_SANDBOX_IMAGE,
            base_url=env.get("CLOVER_BASE_URL") or text("openai", "base_url"),
            api_key=env.get("CLOVER_API_KEY") or env.get("OPENAI_API_KEY"),
        )
