"""Which of a project's optional extras its tests need: what collecting the tests imports.

:func:`collected_imports` reads the test files (and the project's own modules they import, in
turn) with :mod:`ast`, never running them, and keeps the module-level imports that are not
guarded (a ``try``, ``with suppress(...)`` or ``if TYPE_CHECKING`` around one: no need).
:func:`extra_for` tells which declared extra lists a distribution providing a module, by name
(``yaml`` from ``PyYAML``, ``linkify_it`` from ``linkify-it-py``; a few known others in
:data:`KNOWN_DISTRIBUTIONS`). :mod:`clover_agent.environments.python_deps` installs such extras with
the test extras; ``fix``'s diagnosis names the extra when a module is still missing.
"""

from __future__ import annotations

import ast
import re
import stat
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

#: Import names whose distribution is named otherwise (the module → distributions).
KNOWN_DISTRIBUTIONS = {
    "yaml": ("pyyaml",),
    "PIL": ("pillow",),
    "bs4": ("beautifulsoup4",),
    "dateutil": ("python-dateutil",),
    "attr": ("attrs",),
    "sklearn": ("scikit-learn",),
    "skimage": ("scikit-image",),
    "cv2": ("opencv-python", "opencv-python-headless", "opencv-contrib-python"),
    "Crypto": ("pycryptodome",),
    "Cryptodome": ("pycryptodomex",),
    "jwt": ("pyjwt",),
    "serial": ("pyserial",),
    "git": ("gitpython",),
    "OpenSSL": ("pyopenssl",),
    "nacl": ("pynacl",),
    "zmq": ("pyzmq",),
    "socks": ("pysocks",),
    "magic": ("python-magic",),
    "dotenv": ("python-dotenv",),
    "multipart": ("python-multipart",),
    "slugify": ("python-slugify",),
    "docx": ("python-docx",),
    "jose": ("python-jose",),
    "bson": ("pymongo",),
    "railroad": ("railroad-diagrams",),
    "google.protobuf": ("protobuf",),
    "mpl_toolkits": ("matplotlib",),
    "pkg_resources": ("setuptools",),
}
#: An extra's name as PEP 508 allows it (anything else is not offered to pip or shown).
EXTRA_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(\[[^\]]*\])?")
_TEST_DIRS = {"test", "tests", "testing"}
MAX_FILES = 3000
MAX_FILE_BYTES = 512 * 1024


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> tuple[str, tuple[str, ...]] | None:
    """The distribution a requirement string names, and the extras it asks of it."""
    match = _REQUIREMENT_NAME.match(requirement)
    if not match:
        return None
    extras = tuple(e.strip() for e in (match[2] or "[]")[1:-1].split(",") if e.strip())
    return match[1], extras


def distributions(
    requirements: Iterable[str], project: str | None, extras: Mapping[str, list[str]]
) -> list[str]:
    """The distributions of ``requirements``; the project's own extras (``proj[yaml]``) expanded."""
    out: list[str] = []
    todo, seen = list(requirements), set()
    while todo:
        found = requirement_name(todo.pop(0))
        if found is None:
            continue
        name, wanted = found
        if project and normalize(name) == normalize(project):
            for extra in wanted:
                key = next((k for k in extras if normalize(k) == normalize(extra)), None)
                if key is not None and key not in seen:
                    seen.add(key)
                    todo += extras[key]
        elif name not in out:
            out.append(name)
    return out


def provides(distribution: str, module: str, *, loose: bool = True) -> bool:
    """Whether ``distribution`` is, by its name, what provides the import ``module`` (dotted):
    the same name (normalized), ``py``/``python-`` before it or ``-py`` after it, a dotted
    prefix (``ruamel.yaml``), a known other name; ``loose``: also ``module-*`` for an
    undotted module (``railroad`` from ``railroad-diagrams``)."""
    dist = normalize(distribution)
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        name = ".".join(parts[:end])
        if dist in KNOWN_DISTRIBUTIONS.get(name, ()):
            return True
        n = normalize(name)
        if dist in (n, f"py{n}", f"py-{n}", f"python-{n}", f"{n}-py", f"{n}-python"):
            return True
    return loose and len(parts) == 1 and dist.startswith(normalize(module) + "-")


def extra_for(
    module: str, extras: Mapping[str, Iterable[str]], *, loose: bool = True
) -> tuple[str, str] | None:
    """The extra (of ``extras``: name → its distributions) whose distribution provides
    ``module``, and the distribution: an exact match before a loose one, then the extra with the
    fewest distributions (``yaml`` before ``all``)."""
    for strict in (True, False) if loose else (True,):
        found = [
            (len(list(dists)), name, dist)
            for name, dists in extras.items()
            for dist in dists
            if provides(dist, module, loose=not strict)
        ]
        if found:
            _, name, dist = min(found)
            return name, dist
    return None


def is_test_file(rel: str) -> bool:
    parts = rel.split("/")
    name = parts[-1]
    return name.endswith(".py") and (
        name == "conftest.py"
        or name.startswith("test_")
        or name.endswith("_test.py")
        or any(p in _TEST_DIRS for p in parts[:-1])
    )


def collected_imports(root: Path, files: set[str], own: set[str]) -> dict[str, str]:
    """The modules collecting the tests imports (module → the file that imports it first),
    following the project's own modules (top-level names ``own``) as they import others; the
    standard library and the project's own modules left out."""
    queue = sorted(f for f in files if is_test_file(f))[:MAX_FILES]
    seen = set(queue)
    found: dict[str, str] = {}
    while queue:
        rel = queue.pop(0)
        for module, names in _module_imports(root / rel, _package_of(rel)):
            top = module.split(".")[0]
            if top in own:
                for target in [t for m in (module, *names) for t in _own_files(m, files)]:
                    if target not in seen and len(seen) < MAX_FILES:
                        seen.add(target)
                        queue.append(target)
            elif top not in sys.stdlib_module_names and top != "__future__":
                found.setdefault(module, rel)
    return found


def _package_of(rel: str) -> str:
    return ".".join(rel.split("/")[:-1])


def _own_files(module: str, files: set[str]) -> list[str]:
    """The files importing ``module`` (dotted, of the project) runs: each package's
    ``__init__.py`` on the way and the module itself (flat, ``src/`` or ``lib/`` layout)."""
    parts = module.split(".")
    out = []
    for prefix in ("", "src/", "lib/"):
        for end in range(1, len(parts) + 1):
            path = prefix + "/".join(parts[:end])
            for candidate in (f"{path}/__init__.py", f"{path}.py"):
                if candidate in files:
                    out.append(candidate)
    return out


def _module_imports(path: Path, package: str) -> list[tuple[str, tuple[str, ...]]]:
    """The module-level, unguarded imports of a file: (module, the names ``from module import``
    takes, each maybe a submodule), relative ones made absolute within ``package``."""
    try:
        info = path.lstat()  # a symlink or a FIFO is not read (it may lead anywhere, or block)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE_BYTES:
            return []
        tree = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    out: list[tuple[str, tuple[str, ...]]] = []

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                out.extend((alias.name, ()) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".") if package else []
                    anchor = anchor[: len(anchor) - (node.level - 1)] if node.level > 1 else anchor
                    base = ".".join([*anchor, *([base] if base else [])])
                if base:
                    out.append((base, tuple(f"{base}.{a.name}" for a in node.names if a.name != "*")))
            elif isinstance(node, ast.If) and not _is_type_checking(node.test):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.With) and any(_suppresses(item.context_expr) for item in node.items):
                pass  # ``with suppress(ImportError):`` guards its imports as a ``try`` does
            elif isinstance(node, ast.With | ast.For | ast.While | ast.ClassDef):
                visit(node.body)
            elif isinstance(node, ast.Try) and any(_raises(h) for h in node.handlers):
                visit(node.body)  # the handler raises again: the module is needed all the same
            # otherwise a ``try`` body is guarded (the tests cope without it); defs run later

    visit(tree.body)
    return out


def _suppresses(expr: ast.expr) -> bool:
    function = expr.func if isinstance(expr, ast.Call) else None
    return (isinstance(function, ast.Name) and function.id == "suppress") or (
        isinstance(function, ast.Attribute) and function.attr == "suppress"
    )


def _raises(handler: ast.ExceptHandler) -> bool:
    return any(isinstance(node, ast.Raise) for node in handler.body)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )
