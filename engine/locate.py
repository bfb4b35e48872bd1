"""Finding the Clover weights: ``--model DIR``, else ``CLOVER_MODEL``, else the configured path,
else the Hugging Face cache entry for the Clover repository."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

HF_REPO_ID = "Diffuspace/Clover-35B-A3B-Preview"


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


def hf_cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    hf_home = os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
    return Path(hf_home).expanduser() / "hub"


def hf_snapshot(repo_id: str = HF_REPO_ID) -> Path:
    """The newest snapshot folder of ``repo_id`` in the Hugging Face cache (may not exist)."""
    repo = hf_cache_dir() / ("models--" + repo_id.replace("/", "--"))
    ref = repo / "refs" / "main"
    if ref.is_file():
        return repo / "snapshots" / ref.read_text().strip()
    snapshots = sorted((repo / "snapshots").glob("*")) if (repo / "snapshots").is_dir() else []
    return snapshots[-1] if snapshots else repo / "snapshots"


def locate_model(explicit: str | os.PathLike | None = None, configured: str | None = None) -> ModelLocation:
    """Resolve the weights folder in the documented order; an explicit path is never skipped."""
    loc = ModelLocation(path=None)
    candidates: list[tuple[str, Path]] = []
    if explicit:
        candidates.append(("--model", Path(explicit).expanduser()))
    elif os.environ.get("CLOVER_MODEL"):
        candidates.append(("CLOVER_MODEL", Path(os.environ["CLOVER_MODEL"]).expanduser()))
    else:
        if configured:
            candidates.append(("config file", Path(configured).expanduser()))
        candidates.append(("Hugging Face cache", hf_snapshot()))
    for source, path in candidates:
        ok, verdict = is_model_dir(path)
        loc.looked.append((source, str(path), verdict))
        if ok:
            loc.path = path
            break
    return loc
