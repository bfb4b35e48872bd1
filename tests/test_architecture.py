"""Dependencies point one way (docs/architecture.md): every import in the package, lazy ones
included, goes down the layers; and the check does fail on an edge against them."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.import_layers import PACKAGE_ROOTS, edges, layer_of, modules, violations

#: Imports against the direction that another change removes; each names why it is still here. An
#: entry that no longer occurs fails the test, so the list only shrinks.
KNOWN: dict[tuple[str, str], str] = {}


def test_the_package_imports_only_down_the_layers() -> None:
    found = violations()
    unexpected = [str(edge) for edge in found if (edge.source, edge.target) not in KNOWN]
    assert not unexpected, "imports against the layers:\n" + "\n".join(unexpected)
    stale = set(KNOWN) - {(edge.source, edge.target) for edge in found}
    assert not stale, f"these no longer occur; remove them from KNOWN: {sorted(stale)}"


def test_every_module_is_in_a_layer() -> None:
    unplaced = [name for name in modules(PACKAGE_ROOTS) if layer_of(name) is None]
    assert unplaced == []
    # The checker reads the real tree: it sees the engine backend importing the engine lazily.
    assert any(
        e.source == "clover_agent.backends.engine" and e.target == "clover_agent.engine.engine"
        for e in edges(PACKAGE_ROOTS)
    )


def _write(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return {"clover_agent": root / "clover_agent", "clover_agent.engine": root / "engine"}


def test_an_edge_against_the_layers_fails_the_check(tmp_path: Path) -> None:
    """A synthetic package: the same checker that passes on the real tree names each wrong edge,
    whether the import is at the top, lazy inside a function, relative, or under TYPE_CHECKING."""
    roots = _write(
        tmp_path,
        {
            "clover_agent/__init__.py": "",
            "clover_agent/agent/__init__.py": "",
            "clover_agent/agent/loop.py": "from clover_agent.backends.base import ModelBackend\n",
            "clover_agent/backends/__init__.py": "",
            "clover_agent/backends/base.py": "import json\n",
            "clover_agent/cli/__init__.py": "from clover_agent.agent import loop\n",
            "engine/__init__.py": "",
            "engine/ok.py": "from . import __name__ as _\nfrom clover_agent.engine import sub\n",
            "engine/sub.py": "",
        },
    )
    assert violations(roots) == []  # down the layers only

    (tmp_path / "engine" / "bad.py").write_text(
        "def later():\n    from clover_agent.agent.loop import Agent\n    return Agent\n"
    )
    (tmp_path / "clover_agent" / "backends" / "up.py").write_text("from ..agent import loop\n")
    (tmp_path / "clover_agent" / "backends" / "hint.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from clover_agent.cli import main\n"
    )
    found = {(e.source, e.target, e.line) for e in violations(roots)}
    assert found == {
        ("clover_agent.engine.bad", "clover_agent.agent.loop", 2),  # lazy, in a function
        ("clover_agent.backends.up", "clover_agent.agent.loop", 1),  # relative
        ("clover_agent.backends.hint", "clover_agent.cli", 3),  # type checking only
    }
    assert "engine/bad.py:2: clover_agent.engine.bad (engine) imports clover_agent.agent.loop (agent)" in str(
        next(e for e in violations(roots) if e.source.endswith("bad"))
    ).replace(str(tmp_path) + "/", "")


def test_inside_the_engine_and_the_hand_back_imports_go_down(tmp_path: Path) -> None:
    """The engine's groups (text and ops, the model on them, decoding and loading on top) and the
    hand-back every front end shares are layers too: an edge up from them fails the check."""
    files = {
        "clover_agent/__init__.py": "",
        "clover_agent/fix/__init__.py": "",
        "clover_agent/fix/console.py": "",
        "clover_agent/fix/workflow.py": "from clover_agent.handback import stock\n",
        "clover_agent/handback/__init__.py": "",
        "clover_agent/handback/stock.py": "from clover_agent.handback import diagnosis\n",
        "clover_agent/handback/diagnosis.py": "",
        "engine/__init__.py": "",
        "engine/errors.py": "",
        "engine/model/__init__.py": "",
        "engine/model/network.py": "from clover_agent.engine import errors, ops\n",
        "engine/ops/__init__.py": "",
        "engine/decoding/__init__.py": "",
        "engine/decoding/decoder.py": "from clover_agent.engine.model import network\n",
    }
    roots = _write(tmp_path, files)
    assert violations(roots) == []

    (tmp_path / "engine" / "model" / "up.py").write_text("from clover_agent.engine.decoding import decoder\n")
    (tmp_path / "engine" / "ops" / "up.py").write_text("import clover_agent.engine.model.network\n")
    (tmp_path / "clover_agent" / "handback" / "up.py").write_text("from ..fix import console\n")
    assert {(e.source, e.target) for e in violations(roots)} == {
        ("clover_agent.engine.model.up", "clover_agent.engine.decoding.decoder"),
        ("clover_agent.engine.ops.up", "clover_agent.engine.model.network"),
        ("clover_agent.handback.up", "clover_agent.fix.console"),
    }


#: Circles of imports that another change removes; an entry that no longer occurs fails the test.
KNOWN_CIRCLES: list[frozenset[str]] = []


def circles(roots: dict[str, Path]) -> list[frozenset[str]]:
    """Every set of modules that import each other round a circle (lazy and type-checking imports
    included): the strongly connected components of the import graph with more than one module."""
    graph: dict[str, set[str]] = {}
    for edge in edges(roots):
        if edge.source != edge.target:
            graph.setdefault(edge.source, set()).add(edge.target)
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(module: str) -> None:  # Tarjan's algorithm
        order[module] = low[module] = len(order)
        stack.append(module)
        for target in graph.get(module, ()):
            if target not in order:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], order[target])
        if low[module] == order[module]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return found


def test_no_modules_import_each_other_round_a_circle() -> None:
    found = circles(PACKAGE_ROOTS)
    unexpected = [sorted(c) for c in found if c not in KNOWN_CIRCLES]
    assert not unexpected, f"modules that import each other round a circle: {unexpected}"
    assert not [sorted(c) for c in KNOWN_CIRCLES if c not in found], "gone: remove from KNOWN_CIRCLES"


def test_the_circle_check_finds_a_circle(tmp_path: Path) -> None:
    roots = _write(
        tmp_path,
        {
            "clover_agent/__init__.py": "",
            "clover_agent/a.py": "from clover_agent import b\n",
            "clover_agent/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from clover_agent import c\n",
            "clover_agent/c.py": "def f():\n    from clover_agent import a\n",
            "clover_agent/d.py": "from clover_agent import a\n",
        },
    )
    assert circles(roots) == [frozenset({"clover_agent.a", "clover_agent.b", "clover_agent.c"})]


#: Inside ``fix``, a one-way pipeline: each module imports only those of a lower rank (the package's
#: ``__init__`` sits on top, re-exporting the workflow's names).
FIX_RANKS = {
    "runs": 0,
    "progress": 0,
    "targets": 1,
    "regression": 1,
    "report": 2,
    "resume": 2,
    "request": 2,
    "reproduce": 3,
    "decision": 3,
    "console": 3,
    "steps": 4,
    "workflow": 5,
    "fix": 6,
}


def test_inside_fix_imports_go_one_way() -> None:
    inside = [
        e
        for e in edges(PACKAGE_ROOTS)
        if e.source.startswith("clover_agent.fix")
        and e.target.startswith("clover_agent.fix")
        and e.source != e.target
    ]
    assert inside, "the check reads fix's modules"
    names = {e.source.rsplit(".", 1)[-1] for e in inside} | {e.target.rsplit(".", 1)[-1] for e in inside}
    assert names <= set(FIX_RANKS), f"modules of fix without a rank: {names - set(FIX_RANKS)}"
    up = [
        str(e)
        for e in inside
        if FIX_RANKS[e.source.rsplit(".", 1)[-1]] <= FIX_RANKS[e.target.rsplit(".", 1)[-1]]
    ]
    assert not up, "imports up or sideways inside fix:\n" + "\n".join(up)


#: Building an agent session's parts: only clover_agent.session.assembly does it.
ASSEMBLY_CALLS = {"Agent", "McpServers", "gather_facts"}


def test_every_front_end_opens_its_agent_session_in_one_place() -> None:
    """No second assembly: only ``clover_agent.session.assembly`` builds an agent, starts MCP servers
    or gathers the sandbox's facts for a system prompt; ``fix`` (so the CI bot and eval), the TUI
    and ACP open their sessions through it."""
    found = []
    for module, path in modules(PACKAGE_ROOTS).items():
        if module.startswith("clover_agent.agent") or module == "clover_agent.tools.mcp":
            continue  # where they are defined
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                if name in ASSEMBLY_CALLS:
                    found.append(f"{module}:{node.lineno}: {name}(...)")
    assert found and all(f.startswith("clover_agent.session.assembly:") for f in found), "\n".join(found)
    users = {e.source for e in edges(PACKAGE_ROOTS) if e.target == "clover_agent.session.assembly"}
    assert {"clover_agent.fix.steps", "clover_agent.tui.session", "clover_agent.acp.session"} <= users
