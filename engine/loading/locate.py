"""Finding the Clover weights: ``--model DIR``, else ``CLOVER_MODEL``, else the configured path,
else the Hugging Face cache entry for the Clover repository.

The engine reads no environment variable: the caller (``clover_agent.settings``) resolves where to
look and hands it over as :class:`ModelSources`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

HF_REPO_ID = "Diffuspace/Clover-35B-A3B-Preview"


@dataclass(frozen=True)
class ModelSources:
    """Where to look for the weights, in order: ``explicit`` (``--model``) alone when given; else
    ``from_env`` (``CLOVER_MODEL``) alone when set; else ``configured`` (the config file's path),
    then the newest snapshot of :data:`HF_REPO_ID` under ``hf_hub_cache``."""

    explicit: str | os.PathLike | None = None
    from_env: str | None = None
    configured: str | None = None
    hf_hub_cache: Path | None = None


@dataclass
class ModelLocation:
    """Where the weights are (``path``), or every place looked and why it did not qualify."""

    path: Path | None
    looked: list[tuple[str, str, str]] = field(default_factory=list)  # (source, place, verdict)

    def describe(self) -> str:
        lines = [f"  {source}: {place} ({verdict})" for source, place, verdict in self.looked]
        return "\n".join(lines)


def is_model_dir(path: Path) -> tuple[bool, str]:
    """Whether ``path`` looks like a checkpoint folder, with the reason when it does not."""
    if not path.exists():
        return False, "does not exist"
    if not path.is_dir():
        return False, "not a folder"
    if not (path / "config.json").is_file():
        return False, "no config.json"
    if not any(path.glob("*.safetensors")):
        return False, "no *.safetensors"
    return True, "found"


def hf_snapshot(hub_cache: Path, repo_id: str = HF_REPO_ID) -> Path:
    """The newest snapshot folder of ``repo_id`` in the Hugging Face hub cache (may not exist)."""
    repo = hub_cache / ("models--" + repo_id.replace("/", "--"))
    ref = repo / "refs" / "main"
    if ref.is_file():
        return repo / "snapshots" / ref.read_text().strip()
    snapshots = sorted((repo / "snapshots").glob("*")) if (repo / "snapshots").is_dir() else []
    return snapshots[-1] if snapshots else repo / "snapshots"


def locate_model(sources: ModelSources) -> ModelLocation:
    """Resolve the weights folder in the documented order; an explicit path is never skipped."""
    loc = ModelLocation(path=None)
    candidates: list[tuple[str, Path]] = []
    if sources.explicit:
        candidates.append(("--model", Path(sources.explicit).expanduser()))
    elif sources.from_env:
        candidates.append(("CLOVER_MODEL", Path(sources.from_env).expanduser()))
    else:
        if sources.configured:
            candidates.append(("config file", Path(sources.configured).expanduser()))
        if sources.hf_hub_cache is not None:
            candidates.append(("Hugging Face cache", hf_snapshot(sources.hf_hub_cache)))
    for source, path in candidates:
        ok, verdict = is_model_dir(path)
        loc.looked.append((source, str(path), verdict))
        if ok:
            loc.path = path
            break
    return loc
