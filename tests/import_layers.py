"""The package's layers and which may import which, and a checker that finds every import against it.

The checker reads each module's syntax tree (nothing is imported or run), so it sees every import:
top-level ones, those inside functions (lazy imports), ``TYPE_CHECKING`` blocks and relative ones.
docs/architecture.md draws the same picture.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The top-level folders that install as ``clover_agent.<name>``, read from the one place the mapping
#: is written: the links ``clover_agent/<name> -> ../<name>``.
SIBLINGS: tuple[str, ...] = tuple(
    sorted(p.name for p in (ROOT / "clover_agent").iterdir() if p.is_symlink() and p.is_dir())
)
#: Installed module prefix → source folder.
PACKAGE_ROOTS: dict[str, Path] = {
    "clover_agent": ROOT / "clover_agent",
    **{f"clover_agent.{name}": ROOT / name for name in SIBLINGS},
}

#: Module prefix → layer; the longest matching prefix decides.
LAYERS: dict[str, str] = {
    "clover_agent": "package",  # __init__: the version only
    "clover_agent.__main__": "cli",
    "clover_agent.cli": "cli",
    "clover_agent.tui": "tui",
    "clover_agent.ci": "ci",
    "clover_agent.acp": "acp",
    "clover_agent.session": "session",
    "clover_agent.eval": "eval",
    "clover_agent.serve": "serve",
    "clover_agent.launch": "launch",
    "clover_agent.fix": "fix",
    "clover_agent.handback": "handback",
    "clover_agent.agent": "agent",
    "clover_agent.backends": "backends",
    "clover_agent.backends.engine": "backends.engine",
    "clover_agent.tools": "tools",
    "clover_agent.sandboxes": "sandboxes",
    "clover_agent.environments": "environments",
    "clover_agent.engine": "engine",
    "clover_agent.engine.model": "engine.model",
    "clover_agent.engine.ops": "engine.ops",
    "clover_agent.engine.decoding": "engine.decoding",
    "clover_agent.engine.loading": "engine.loading",
    "clover_agent.engine.text": "engine.text",
    "clover_agent.kernels": "kernels",
    "clover_agent.settings": "settings",
    "clover_agent.protocol": "protocol",
    "clover_agent.events": "events",
    "clover_agent.errors": "errors",
    "clover_agent.safe_text": "safe_text",
    "clover_agent.hooks": "hooks",
    "clover_agent.harbor": "harbor",
}

_SHARED = {"package", "errors", "events", "protocol", "safe_text"}
#: The engine's top (``Engine``, its errors) and its groups, each a layer of its own inside it.
_ENGINE = {"engine", "engine.model", "engine.ops", "engine.decoding", "engine.loading", "engine.text"}
_ENGINE_ERRORS = "clover_agent.engine.errors"
_BELOW_FRONT_ENDS = {
    "launch",
    "fix",
    "handback",
    "session",
    "agent",
    "hooks",
    "backends",
    "tools",
    "sandboxes",
    "environments",
    "settings",
    *_SHARED,
}
#: Layer → what it may import besides itself: layer names, or module prefixes for a narrow allowance.
ALLOWED: dict[str, set[str]] = {
    # Front ends: cli dispatches to the others; none imports the CLI, and the TUI, the CI bot and eval
    # not each other.
    "cli": {"tui", "ci", "acp", "eval", "serve", *_BELOW_FRONT_ENDS, "backends.engine", *_ENGINE},
    # One agent session's assembly (sandbox, MCP servers, agent, facts), the sessions' store and
    # events: nothing of a front end.
    "session": {"agent", "hooks", "backends", "tools", "sandboxes", "environments", *_SHARED},
    "tui": set(_BELOW_FRONT_ENDS),
    "ci": set(_BELOW_FRONT_ENDS),
    "eval": set(_BELOW_FRONT_ENDS),
    # The interactive front ends keep their sessions in one store, with their own events; ACP never
    # imports the TUI (nor the TUI ACP).
    "acp": set(_BELOW_FRONT_ENDS),
    # The OpenAI-compatible server: the engine backend's prompt code around the batch engine.
    "serve": {"backends", "backends.engine", *_ENGINE, *_SHARED},
    # Harbor's agent class runs in Harbor's process (Python >= 3.12, none of clover-agent's
    # dependencies installed): it drives `clover-agent run` in the task's container and imports
    # nothing of ours but the version.
    "harbor": {"package"},
    # Builds backends and sandbox specs from options and settings (engine.locate: where weights are).
    "launch": {
        "backends",
        "backends.engine",
        "clover_agent.engine.loading.locate",
        "sandboxes",
        "environments",
        "settings",
        "tools",
        "hooks",
        *_SHARED,
    },
    "fix": {
        "handback",
        "session",
        "agent",
        "hooks",
        "backends",
        "tools",
        "sandboxes",
        "environments",
        *_SHARED,
    },
    # The hand-back every front end shares (snapshots, patch, held-out runs, checks, verdict, a
    # session's offers, apply) knows none of them: not the fix workflow, its console or its reports.
    "handback": {"hooks", "tools", "sandboxes", "environments", *_SHARED},
    "agent": {"hooks", "backends", "tools", "sandboxes", "environments", *_SHARED},
    # The user's hooks: run on the host or in a sandbox, reported as events; below the agent and
    # the hand-back, which both run them.
    "hooks": {"sandboxes", *_SHARED},
    "backends": {"backends.engine", *_SHARED},
    "backends.engine": {"backends", *_ENGINE, *_SHARED},
    "tools": {"sandboxes", "environments", "package"},
    # Where tools run; a project's environment (found by ``environments``) is set up and cached there.
    "sandboxes": {"environments", "package"},
    # What a project's environment needs, found from its files: below the sandboxes (their error
    # types only), so discovery runs and is tested without one.
    "environments": {"clover_agent.sandboxes.errors", "package"},
    "engine": {*_ENGINE, "kernels", "package"},
    # Inside the engine: text and ops at the bottom, the model on the ops, decoding and loading on both.
    "engine.text": {_ENGINE_ERRORS, "package"},
    "engine.ops": {_ENGINE_ERRORS, "kernels", "package"},
    "engine.model": {"engine.ops", _ENGINE_ERRORS, "kernels", "package"},
    "engine.decoding": {"engine.model", "engine.ops", "engine.text", _ENGINE_ERRORS, "kernels", "package"},
    "engine.loading": {"engine.model", "engine.ops", "engine.text", _ENGINE_ERRORS, "package"},
    "kernels": {"package"},
    "settings": {"errors", "sandboxes", "environments", "package"},
    "protocol": {"errors", "package"},
    "events": {"package"},
    "safe_text": {"package"},
    # The one table from every layer's errors to exit codes knows each layer's error module.
    "errors": {"clover_agent.engine.errors", "clover_agent.sandboxes.errors", "package"},
    "package": set(),
}


@dataclass(frozen=True, order=True)
class Edge:
    """``source`` imports ``target`` at ``line`` of ``path``."""

    source: str
    target: str
    path: str
    line: int

    def __str__(self) -> str:
        return (
            f"{self.path}:{self.line}: {self.source} ({layer_of(self.source)}) imports {self.target} "
            f"({layer_of(self.target)})"
        )


def layer_of(module: str) -> str | None:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len, default=None)
    return None if best is None else LAYERS[best]


def allowed(source: str, target: str) -> bool:
    mine, theirs = layer_of(source), layer_of(target)
    if theirs is None or mine == theirs:
        return True
    rules = ALLOWED.get(mine or "", set())
    return theirs in rules or any(target == r or target.startswith(r + ".") for r in rules)


def modules(roots: dict[str, Path]) -> dict[str, Path]:
    """Every module under ``roots`` (module prefix → folder), by its installed name."""
    found: dict[str, Path] = {}
    for prefix, folder in roots.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([prefix, *parts])] = path
    return found


def imported(module: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(target module, line) for every import in ``path``, wherever it is in the file. ``from X import
    Y`` counts as importing ``X.Y`` when that is a module of ours, else ``X``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            for alias in node.names:
                candidate = f"{origin}.{alias.name}"
                out.append((candidate if candidate in known else origin, node.lineno))
    return [(target, line) for target, line in out if target.split(".")[0] == "clover_agent"]


def edges(roots: dict[str, Path]) -> list[Edge]:
    found = modules(roots)
    known = set(found)
    return sorted(
        Edge(module, target, str(path), line)
        for module, path in found.items()
        for target, line in imported(module, path, known)
    )


def violations(roots: dict[str, Path] | None = None) -> list[Edge]:
    """Every import against :data:`ALLOWED` in the package (or in ``roots``)."""
    return [edge for edge in edges(roots or PACKAGE_ROOTS) if not allowed(edge.source, edge.target)]
