"""The tamper scan: what a patch adds to the code under test that could fake a pass.

That code runs inside the held-out judging process, where it could notice it is tested or reach
into the runner. :func:`scan_changes` reports, by syntax tree, each of these the patch adds:

- ``runner``: test runner or test modules, runner names looked up, runner internals, Clover's own names;
- ``exit``: ``os._exit``, exits outside ``main``, ``atexit``, kills and signals, ``faulthandler`` exits;
- ``interpreter``: ``sys.modules``, builtins, import hooks, frames, tracing, streams, gc, ctypes, env writes;
- ``environment``: test runners' and CI's environment variables read, or the whole environment;
- ``dynamic``: ``exec``/``eval``/``compile``, computed imports and lookups, decoded names, code objects;
- ``comparison``: comparison, hash or truth dunders that return a constant or ignore the other operand;
- ``unparsable``: a file that parsed before the change and no longer does.
"""

from __future__ import annotations

import ast
import base64
import binascii
import builtins
import codecs
import difflib
import operator
import re
import warnings
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from clover_agent.handback.patches import is_test_file


@dataclass(frozen=True)
class Finding:
    """One construct the patch adds that could fake a pass."""

    #: The file's repository-relative posix path.
    path: str
    #: The 1-based line in the patched file.
    line: int
    #: The rule's id, one of :data:`RULES`' keys.
    rule: str
    #: One short sentence naming the construct (free of control characters).
    reason: str

    def describe(self) -> str:
        """``path:line: reason``."""
        return f"{self.path}:{self.line}: {self.reason}"


#: Rule id -> what the rule catches, one line each.
RULES: dict[str, str] = {
    "runner": "imports or looks up a test runner or test module, or names runner internals or Clover's own",
    "exit": "ends the process or hooks its end (os._exit, sys.exit outside main, atexit, kill, signals)",
    "interpreter": "changes or inspects interpreter state (sys.modules, builtins, import hooks, frames, "
    "trace hooks, streams, gc, ctypes, environment writes, /proc/self)",
    "environment": "reads a test runner's or CI's environment variable, or the whole environment",
    "dynamic": "runs or resolves code at run time (exec, eval, compile, computed imports and lookups, "
    "decoded names, code objects)",
    "comparison": "a comparison, hash or truth method that returns a constant or ignores the other operand",
    "unparsable": "the file parsed before the change and no longer does",
}

_UNKNOWN = object()  # what cannot be folded
_NOT_IMPLEMENTED = object()  # ``return NotImplemented``
_FREE = object()  # a name no enclosing scope binds
_MAX_TEXT = 4096  # the longest string (or sequence) the folder builds
_MAX_DEPTH = 40  # how deep the folder and the resolver go
_FOLD_BUDGET = 400_000  # the most folding steps per file (a file needs about one a node)

#: Modules of test runners.
_RUNNER_MODULES = frozenset(
    {"pytest", "_pytest", "py", "pluggy", "xdist", "nose", "nose2", "unittest", "doctest"}
)
#: Strings naming a test runner, where they are compared with something.
_RUNNER_TEXT = re.compile(r"(?i)py\.?test|unittest|pluggy|xdist|\bnose(?:2|tests)\b")
#: Names of runner internals (attributes, classes).
_RUNNER_NAMES = frozenset(
    {
        "TestReport",
        "CollectReport",
        "CallInfo",
        "pluginmanager",
        "PytestPluginManager",
        "_pytest",
        "wasxfail",
        "longrepr",
        "longreprtext",
        "hookimpl",
        "hookwrapper",
        "runtestprotocol",
    }
)
#: Environment variables that tell a test run (or CI) apart, as prefixes of the upper-cased name.
_ENV_PREFIXES = (
    "PYTEST",
    "_PYTEST",
    "TOX_",
    "UNITTEST",
    "CLOVER",
    "COV_CORE",
    "NOSE",
    "CONTINUOUS_INTEGRATION",
    "GITHUB_ACTIONS",
    "GITLAB_CI",
    "TRAVIS",
    "JENKINS_",
    "BUILDKITE",
    "CIRCLECI",
)
#: Such names, in any string constant of the code under test.
_ENV_SHAPE = re.compile(r"^(?:_?PYTEST(?:_\w*)?|TOX_ENV_NAME|TOX_\w+|COV_CORE_\w+|UNITTEST\w*|NOSE_\w+)$")
_PROC = re.compile(r"^/proc/?$|/proc/(?:self|thread-self)\b|^/proc/(?:\d|%|\{)")

_ENVIRON = frozenset({"os.environ", "os.environb"})
_ENV_GETTERS = frozenset(
    {
        "os.getenv",
        "os.getenvb",
        "os.environ.get",
        "os.environb.get",
        "os.environ.__getitem__",
        "os.environ.__contains__",
        "os.environ.pop",
        "os.environ.setdefault",
    }
)
_ENV_WHOLE = frozenset(
    {"keys", "items", "values", "copy", "__iter__", "__repr__", "__str__", "__len__", "_data", "__dict__"}
)
_ENV_WRITE = frozenset(
    {"setdefault", "update", "pop", "popitem", "clear", "__setitem__", "__delitem__", "__ior__"}
)

#: Qualified names flagged wherever they are used: rule, what they are.
_USES: dict[str, tuple[str, str]] = {
    "os._exit": ("exit", "ends the process at once"),
    "os.abort": ("exit", "ends the process at once"),
    "os.kill": ("exit", "signals a process"),
    "os.killpg": ("exit", "signals a process group"),
    "signal.signal": ("exit", "installs a signal handler"),
    "signal.alarm": ("exit", "schedules a signal"),
    "signal.setitimer": ("exit", "schedules a signal"),
    "signal.raise_signal": ("exit", "signals the process"),
    "signal.pthread_kill": ("exit", "signals a thread"),
    "atexit.register": ("exit", "registers an at-exit hook"),
    "sys.modules": ("interpreter", "the interpreter's loaded modules"),
    "sys.meta_path": ("interpreter", "import machinery"),
    "sys.path_hooks": ("interpreter", "import machinery"),
    "sys.path_importer_cache": ("interpreter", "import machinery"),
    "importlib.abc": ("interpreter", "import machinery"),
    "importlib.machinery": ("interpreter", "import machinery"),
    "sys.settrace": ("interpreter", "trace hooks"),
    "sys.setprofile": ("interpreter", "trace hooks"),
    "sys.gettrace": ("interpreter", "trace hooks"),
    "sys.getprofile": ("interpreter", "trace hooks"),
    "sys.monitoring": ("interpreter", "trace hooks"),
    "sys.call_tracing": ("interpreter", "trace hooks"),
    "sys.addaudithook": ("interpreter", "audit hooks"),
    "threading.settrace": ("interpreter", "trace hooks"),
    "threading.setprofile": ("interpreter", "trace hooks"),
    "threading.settrace_all_threads": ("interpreter", "trace hooks"),
    "threading.setprofile_all_threads": ("interpreter", "trace hooks"),
    "sys._getframe": ("interpreter", "stack introspection"),
    "sys._current_frames": ("interpreter", "stack introspection"),
    "sys._getframemodulename": ("interpreter", "stack introspection"),
    "inspect.stack": ("interpreter", "stack introspection"),
    "inspect.currentframe": ("interpreter", "stack introspection"),
    "inspect.getouterframes": ("interpreter", "stack introspection"),
    "inspect.getinnerframes": ("interpreter", "stack introspection"),
    "inspect.trace": ("interpreter", "stack introspection"),
    "traceback.extract_stack": ("interpreter", "stack introspection"),
    "traceback.format_stack": ("interpreter", "stack introspection"),
    "traceback.print_stack": ("interpreter", "stack introspection"),
    "traceback.walk_stack": ("interpreter", "stack introspection"),
    "gc.get_objects": ("interpreter", "walks the garbage collector's objects"),
    "gc.get_referrers": ("interpreter", "walks the garbage collector's objects"),
    "gc.get_referents": ("interpreter", "walks the garbage collector's objects"),
    "os.putenv": ("interpreter", "changes the environment"),
    "os.unsetenv": ("interpreter", "changes the environment"),
    "os.dup2": ("interpreter", "redirects a file descriptor"),
    "os.getppid": ("interpreter", "the parent process, a test runner's"),
    "sys.__stdout__": ("interpreter", "the process's own standard output, past any capture"),
    "sys.__stderr__": ("interpreter", "the process's own standard error, past any capture"),
    "contextlib.redirect_stdout": ("interpreter", "replaces sys.stdout"),
    "contextlib.redirect_stderr": ("interpreter", "replaces sys.stderr"),
    "importlib.reload": ("interpreter", "reloads a module"),
    "builtins.exec": ("dynamic", "runs code built at run time"),
    "builtins.eval": ("dynamic", "runs code built at run time"),
    "builtins.compile": ("dynamic", "compiles code built at run time"),
    "types.FunctionType": ("dynamic", "builds a function from a code object"),
    "types.LambdaType": ("dynamic", "builds a function from a code object"),
    "types.CodeType": ("dynamic", "builds a code object"),
    "marshal.loads": ("dynamic", "loads code objects"),
    "marshal.load": ("dynamic", "loads code objects"),
    "runpy.run_path": ("dynamic", "runs code by path"),
    "runpy.run_module": ("dynamic", "runs code by module name"),
    "code.InteractiveInterpreter": ("dynamic", "runs source text"),
    "code.InteractiveConsole": ("dynamic", "runs source text"),
    "code.interact": ("dynamic", "runs source text"),
    "codeop.compile_command": ("dynamic", "compiles source text"),
    "codeop.Compile": ("dynamic", "compiles source text"),
    "codeop.CommandCompiler": ("dynamic", "compiles source text"),
    "pydoc.locate": ("dynamic", "imports an object by a name given as a string"),
    "pkgutil.resolve_name": ("dynamic", "imports an object by a name given as a string"),
    "pickle.load": ("dynamic", "loads objects that can run code"),
    "pickle.Unpickler": ("dynamic", "loads objects that can run code"),
    "shelve.open": ("dynamic", "loads objects that can run code"),
    "cProfile.run": ("dynamic", "runs code given as text"),
    "cProfile.runctx": ("dynamic", "runs code given as text"),
    "profile.run": ("dynamic", "runs code given as text"),
    "profile.runctx": ("dynamic", "runs code given as text"),
    "pdb.run": ("dynamic", "runs code given as text"),
    "pdb.runeval": ("dynamic", "runs code given as text"),
    "pdb.runctx": ("dynamic", "runs code given as text"),
    "bdb.Bdb": ("dynamic", "runs code under a debugger"),
    "trace.Trace": ("dynamic", "runs code under a tracer"),
    "timeit.Timer": ("dynamic", "runs code given as text"),
    "timeit.timeit": ("dynamic", "runs code given as text"),
    "timeit.repeat": ("dynamic", "runs code given as text"),
    "zipimport.zipimporter": ("interpreter", "import machinery"),
    "sys.path": ("interpreter", "where modules are imported from"),
    "sys.unraisablehook": ("interpreter", "the interpreter's hook for errors it cannot raise"),
    "sys.excepthook": ("interpreter", "the interpreter's hook for uncaught errors"),
    "signal.getitimer": ("interpreter", "reads the process's timers (a test runner's time limit)"),
    "signal.getsignal": ("interpreter", "reads a signal's handler (a test runner's time limit)"),
    "faulthandler.is_enabled": (
        "interpreter",
        "asks whether the fault handler is on (test runners turn it on)",
    ),
    "logging.currentframe": ("interpreter", "stack introspection"),
}
#: Strings that name the sandbox the tests run in, or a frame's attributes (for ``attrgetter``).
_SANDBOX_TEXT = re.compile(r"^/\.dockerenv$|^/run/\.containerenv$|^/workspace(?:/|$)|/proc/1/cgroup")
_FRAME_TEXT = re.compile(r"\b(?:f_back|f_globals|f_locals|f_code|f_builtins|tb_frame|gi_frame|cr_frame)\b")
#: Names of functions that are a program's entry point (exits and ``sys.argv`` belong there).
_ENTRY_POINT = re.compile(r"^_*(?:main|cli|\w+_main|\w+_cli|main_\w+|cli_\w+|console_\w+|entry_?point)$")
#: Exits that are fine in a main block or a function named ``main``.
_SOFT_EXITS = frozenset({"sys.exit", "builtins.exit", "builtins.quit"})
#: What replacing these (assignment, ``setattr``) does to the process.
_REPLACED = frozenset(
    {
        "sys.stdout",
        "sys.stderr",
        "sys.stdin",
        "sys.__stdout__",
        "sys.__stderr__",
        "sys.__stdin__",
        "sys.excepthook",
        "sys.displayhook",
        "sys.unraisablehook",
        "sys.breakpointhook",
        "threading.excepthook",
        "sys.modules",
        "sys.meta_path",
        "sys.path_hooks",
        "os.environ",
        "os.environb",
    }
)
#: Attributes of frames, tracebacks and functions that reach another frame's or module's state.
_FRAME_ATTRS = frozenset(
    {
        "f_back",
        "f_globals",
        "f_locals",
        "f_code",
        "f_builtins",
        "f_trace",
        "tb_frame",
        "gi_frame",
        "cr_frame",
        "ag_frame",
        "__globals__",
    }
)
#: Attribute names distinctive enough to flag on any object (an alias the resolver does not follow).
_DISTINCT_ATTRS: dict[str, tuple[str, str]] = {
    "_getframe": ("interpreter", "stack introspection"),
    "_current_frames": ("interpreter", "stack introspection"),
    "_exit": ("exit", "ends the process at once"),
    "settrace": ("interpreter", "trace hooks"),
    "setprofile": ("interpreter", "trace hooks"),
    "addaudithook": ("interpreter", "audit hooks"),
    "meta_path": ("interpreter", "import machinery"),
    "path_hooks": ("interpreter", "import machinery"),
    "path_importer_cache": ("interpreter", "import machinery"),
    "get_referrers": ("interpreter", "walks the garbage collector's objects"),
    "get_referents": ("interpreter", "walks the garbage collector's objects"),
    "__subclasses__": ("interpreter", "walks every subclass of a class"),
    "exec_module": ("dynamic", "runs a module's code"),
    "findCaller": ("interpreter", "stack introspection"),
    "runctx": ("dynamic", "runs code given as text"),
    "runcall": ("dynamic", "runs code under a profiler or debugger"),
    "runeval": ("dynamic", "runs code given as text"),
    "getitimer": ("interpreter", "reads the process's timers (a test runner's time limit)"),
    "getsignal": ("interpreter", "reads a signal's handler (a test runner's time limit)"),
}
#: Modules whose use (not only import) is a finding.
_LOOKED_UP = _RUNNER_MODULES | {"atexit", "ctypes", "_ctypes", "__main__"}
_IMPORTERS = frozenset({"builtins.__import__", "importlib.import_module", "importlib.__import__"})
_FINDERS = frozenset(
    {"importlib.util.find_spec", "importlib.find_loader", "pkgutil.find_loader", "pkgutil.get_loader"}
)
_ATTR_FUNCS = frozenset({"builtins.getattr", "builtins.setattr", "builtins.delattr", "builtins.hasattr"})
#: Objects on which a lookup by a computed name is dynamic code.
_SENSITIVE = frozenset(
    {
        "sys",
        "os",
        "builtins",
        "importlib",
        "gc",
        "inspect",
        "ctypes",
        "_ctypes",
        "atexit",
        "signal",
        "traceback",
        "faulthandler",
        "marshal",
        "threading",
        "__main__",
        "pytest",
        "_pytest",
        "unittest",
        "<globals>",
    }
)
_PICKLE_LOADS = frozenset(
    {"pickle.loads", "_pickle.loads", "cPickle.loads", "dill.loads", "cloudpickle.loads"}
)
_TEXT_TESTS = frozenset(
    {"startswith", "endswith", "find", "rfind", "index", "rindex", "count", "__contains__", "__eq__"}
)
_PATTERN_TESTS = frozenset(
    {"re.search", "re.match", "re.fullmatch", "re.findall", "re.finditer", "fnmatch.fnmatch"}
)
_FD_WRITERS = frozenset({"os.write", "os.close", "os.fdopen", "builtins.open", "io.open", "os.dup"})
#: What a name from ``from M import *`` may stand for.
_STARRED_NAMES = frozenset(_USES) | _SOFT_EXITS | _ENVIRON | _ENV_GETTERS | _IMPORTERS | _FINDERS

_CMP_DUNDERS = frozenset(
    {
        "__eq__",
        "__ne__",
        "__lt__",
        "__le__",
        "__gt__",
        "__ge__",
        "__hash__",
        "__bool__",
        "__contains__",
        "__instancecheck__",
        "__subclasscheck__",
    }
)
_OPERAND_DUNDERS = _CMP_DUNDERS - {"__hash__", "__bool__"}

#: The nodes that bind names or make aliases.
_PREPARED = frozenset(
    {
        ast.Name,
        ast.arg,
        ast.FunctionDef,
        ast.AsyncFunctionDef,
        ast.ClassDef,
        ast.Import,
        ast.ImportFrom,
        ast.ExceptHandler,
        ast.Global,
        ast.Nonlocal,
        ast.Assign,
        ast.AnnAssign,
        ast.NamedExpr,
        ast.For,
        ast.AsyncFor,
        ast.comprehension,
    }
)
_SCOPES = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_BUILTIN_NAMES = frozenset(n for n in dir(builtins) if not n.startswith("_")) | {
    "__import__",
    "__build_class__",
}
_MODULE_NAME = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")
_REROOTED = frozenset({"sys", "os", "builtins"})

_TEXT_METHODS = frozenset(
    {
        "upper",
        "lower",
        "casefold",
        "swapcase",
        "title",
        "capitalize",
        "strip",
        "lstrip",
        "rstrip",
        "replace",
        "removeprefix",
        "removesuffix",
        "join",
        "format",
        "decode",
        "encode",
        "split",
        "rsplit",
    }
)
_CODECS = frozenset(
    {
        "rot13",
        "rot_13",
        "hex",
        "hex_codec",
        "base64",
        "base_64",
        "base64_codec",
        "utf_8",
        "utf8",
        "ascii",
        "latin_1",
        "latin1",
        "iso8859_1",
        "unicode_escape",
        "raw_unicode_escape",
        "utf_16",
        "utf_32",
    }
)
_WIDE_FORMAT = re.compile(r"\d{4,}|\*|\{[^{}]*\{")


def _show(value: object) -> str:
    """``value`` as ``repr`` shows it, at most 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _show_name(name: str) -> str:
    """A dotted name as it is, or quoted when it is not a plain one (built from strings)."""
    return name if len(name) <= 80 and _MODULE_NAME.match(name) else _show(name)


def _clean(text: str) -> str:
    """``text`` with every character that is not printable escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _normalize(qual: str) -> str:
    """The canonical name of what ``qual`` names: ``posix.environ`` is ``os.environ``, and a module
    reached as another's attribute (``shutil.os``, ``inspect.sys``) is itself."""
    parts = qual.split(".")
    if parts[0] in ("posix", "nt"):
        parts[0] = "os"
    elif parts[0] == "__builtin__":
        parts[0] = "builtins"
    for i in range(1, len(parts)):
        if parts[i] == "__builtins__":
            parts[i] = "builtins"
        if parts[i] in _REROOTED and parts[0] != "builtins":
            return ".".join(parts[i:])
    return ".".join(parts)


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of names and attributes, else None."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    names.append(node.id)
    return ".".join(reversed(names))


def _unparse(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # a node the unparser does not know, or one nested too deeply
        return type(node).__name__


def _body_without_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        return body[1:]
    return body


def _own_nodes(nodes: list[ast.AST]) -> Iterator[ast.AST]:
    """The nodes under ``nodes`` outside nested functions, lambdas and classes (whose own nodes,
    but for their names, belong to another scope)."""
    stack = list(nodes)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        stack.extend(ast.iter_child_nodes(node))


def _returns(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.expr | None]:
    """The values of ``fn``'s own ``return`` statements (None for a bare ``return``)."""
    return [n.value for n in _own_nodes(list(fn.body)) if isinstance(n, ast.Return)]


def _is_test_module(name: str) -> bool:
    """Whether the module ``name`` is a test module (as :func:`is_test_file` tells test files)."""
    parts = name.split(".")
    return any(p in ("tests", "conftest") for p in parts) or is_test_file("/".join(parts) + ".py")


def _falls_off(body: list[ast.stmt]) -> bool:
    """Whether running ``body`` may reach its end (and a function return None there)."""
    if not body:
        return True
    last = body[-1]
    if isinstance(last, (ast.Return, ast.Raise)):
        return False
    if isinstance(last, ast.If):
        return _falls_off(last.body) or _falls_off(last.orelse)
    if isinstance(last, (ast.With, ast.AsyncWith)):
        return _falls_off(last.body)
    if isinstance(last, ast.Try):
        return (_falls_off(last.orelse) if last.orelse else _falls_off(last.body)) or any(
            _falls_off(h.body) for h in last.handlers
        )
    if isinstance(last, ast.While) and isinstance(last.test, ast.Constant) and last.test.value:
        return any(isinstance(n, ast.Break) for n in _own_nodes(list(last.body)))
    return True


def _other_parameter(args: ast.arguments) -> str | None:
    """The parameter a binary dunder gets the other operand in."""
    positional = [*args.posonlyargs, *args.args]
    if len(positional) >= 2:
        return positional[1].arg
    return args.vararg.arg if args.vararg is not None else None


def _reads(fn: ast.AST, name: str) -> bool:
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load):
            return True
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("locals", "vars", "eval", "exec")
        ):
            return True
    return False


def _is_main_guard(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and any(
        isinstance(s, ast.Constant) and s.value == "__main__" for s in sides
    )


def _sized(value: Any) -> Any:
    """``value``, or unknown when it is too large to keep folding."""
    if isinstance(value, (str, bytes, list, tuple)) and len(value) > _MAX_TEXT:
        return _UNKNOWN
    if isinstance(value, int) and abs(value) > 2**64:
        return _UNKNOWN
    return value


def _number(value: object) -> bool:
    return isinstance(value, (int, float))


def _binop(op: ast.operator, left: Any, right: Any) -> Any:
    """``left op right`` for the operators that cannot blow up, within size limits."""
    sequence = (str, bytes, list, tuple)
    if isinstance(op, ast.Add):
        if _number(left) and _number(right):
            return left + right
        if isinstance(left, sequence) and type(left) is type(right):
            joined: Any = left
            return joined + right if len(left) + len(right) <= _MAX_TEXT else _UNKNOWN
        return _UNKNOWN
    if isinstance(op, ast.Mult):
        if isinstance(right, sequence) and isinstance(left, int):
            left, right = right, left
        if isinstance(left, sequence) and isinstance(right, int) and not isinstance(right, bool):
            return left * right if len(left) * max(right, 0) <= _MAX_TEXT else _UNKNOWN
        if _number(left) and _number(right):
            return left * right
        return _UNKNOWN
    if isinstance(op, ast.Mod) and isinstance(left, (str, bytes)):
        if _WIDE_FORMAT.search(left if isinstance(left, str) else left.decode("latin-1")):
            return _UNKNOWN
        return left % right
    if not (isinstance(left, int) and isinstance(right, int)):
        return _UNKNOWN
    if isinstance(op, ast.Pow):
        return left**right if 0 <= right <= 64 and abs(left) <= 2**16 else _UNKNOWN
    if isinstance(op, (ast.LShift, ast.RShift)) and not 0 <= right <= 64:
        return _UNKNOWN
    simple: dict[type, Callable[[int, int], int]] = {
        ast.Sub: operator.sub,
        ast.Mod: operator.mod,
        ast.FloorDiv: operator.floordiv,
        ast.BitXor: operator.xor,
        ast.BitAnd: operator.and_,
        ast.BitOr: operator.or_,
        ast.LShift: operator.lshift,
        ast.RShift: operator.rshift,
    }
    function = simple.get(type(op))
    return function(left, right) if function is not None else _UNKNOWN


_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: operator.contains(b, a),
    ast.NotIn: lambda a, b: not operator.contains(b, a),
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}


def _text_method(receiver: str | bytes, name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """``receiver.name(*args, **kwargs)`` for the string methods that cannot blow up."""
    if (
        name == "replace"
        and len(args) >= 2
        and isinstance(args[1], (str, bytes))
        and len(receiver) * max(len(args[1]), 1) > 4 * _MAX_TEXT
    ):
        return _UNKNOWN
    if name == "join" and args and sum(len(a) for a in args[0] if isinstance(a, (str, bytes))) > _MAX_TEXT:
        return _UNKNOWN
    if name == "format":
        template = receiver if isinstance(receiver, str) else ""
        if _WIDE_FORMAT.search(template) or any(isinstance(a, int) and abs(a) > 9999 for a in args):
            return _UNKNOWN
    if name in ("decode", "encode"):
        encoding = args[0] if args else kwargs.get("encoding", "utf-8")
        if not isinstance(encoding, str) or encoding.lower().replace("-", "_") not in _CODECS:
            return _UNKNOWN
    return getattr(receiver, name)(*args, **kwargs)


def _text(value: object) -> str | None:
    """A folded string or bytes as text."""
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return value if isinstance(value, str) else None


def _codec(decode: bool) -> Callable[..., Any]:
    def run(value: Any, encoding: Any = "utf-8", errors: Any = "strict") -> Any:
        if not isinstance(encoding, str) or encoding.lower().replace("-", "_") not in _CODECS:
            return _UNKNOWN
        return (codecs.decode if decode else codecs.encode)(value, encoding, errors)

    return run


def _inflate(data: Any, *rest: Any) -> Any:
    if rest or not isinstance(data, bytes):
        return _UNKNOWN
    inflater = zlib.decompressobj()
    out = inflater.decompress(data, _MAX_TEXT)
    return _UNKNOWN if inflater.unconsumed_tail else out


def _to_bytes(*args: Any) -> Any:
    if len(args) == 1 and isinstance(args[0], (list, tuple, bytes)):
        return bytes(args[0])
    if len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        return _text_method(args[0], "encode", list(args[1:]), {})
    return _UNKNOWN


def _to_str(*args: Any) -> Any:
    if len(args) == 1 and isinstance(args[0], (str, int, float)):
        return str(args[0])
    if len(args) >= 2 and isinstance(args[0], bytes) and isinstance(args[1], str):
        return _text_method(args[0], "decode", list(args[1:]), {})
    return _UNKNOWN


def _to_int(*args: Any) -> Any:
    if args and isinstance(args[0], str) and len(args[0]) > 100:
        return _UNKNOWN
    return int(*args)


def _small_range(*args: Any) -> Any:
    numbers = range(*args)
    return list(numbers) if len(numbers) <= _MAX_TEXT else _UNKNOWN


#: Pure functions the folder may call on folded constants.
_PURE: dict[str, Callable[..., Any]] = {
    "builtins.chr": chr,
    "builtins.ord": ord,
    "builtins.str": _to_str,
    "builtins.bytes": _to_bytes,
    "builtins.bytearray": _to_bytes,
    "builtins.int": _to_int,
    "builtins.bool": bool,
    "builtins.len": len,
    "builtins.abs": abs,
    "builtins.list": list,
    "builtins.tuple": tuple,
    "builtins.reversed": lambda v: list(reversed(v)),
    "builtins.range": _small_range,
    "builtins.bytes.fromhex": bytes.fromhex,
    "builtins.bytearray.fromhex": bytes.fromhex,
    "base64.b64decode": base64.b64decode,
    "base64.standard_b64decode": base64.standard_b64decode,
    "base64.urlsafe_b64decode": base64.urlsafe_b64decode,
    "base64.b32decode": base64.b32decode,
    "base64.b16decode": base64.b16decode,
    "base64.a85decode": base64.a85decode,
    "base64.b85decode": base64.b85decode,
    "base64.decodebytes": base64.decodebytes,
    "binascii.unhexlify": binascii.unhexlify,
    "binascii.a2b_hex": binascii.a2b_hex,
    "binascii.a2b_base64": binascii.a2b_base64,
    "codecs.decode": _codec(True),
    "codecs.encode": _codec(False),
    "zlib.decompress": _inflate,
}
#: What turns an encoded constant into a name: seen in a name, the name was hidden.
_DECODERS = frozenset(
    {q for q in _PURE if q.startswith(("base64.", "binascii.", "codecs.", "zlib."))}
    | {"builtins.chr", "builtins.bytes", "builtins.bytearray", "builtins.reversed"}
    | {"builtins.bytes.fromhex", "builtins.bytearray.fromhex"}
)


#: What a ``visit_*`` method returns: the children to visit (and callbacks), or None for all.
_Children = list[ast.AST | Callable[[], object]] | None


@dataclass(frozen=True)
class _Hit:
    line: int
    rule: str
    reason: str
    key: str


class _Scanner:
    """One file's findings (all of them: which are new is decided by :func:`scan_changes`)."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.hits: list[_Hit] = []
        self.parents: dict[ast.AST, ast.AST] = {}
        self.scope_of: dict[ast.AST, ast.AST] = {}
        self.children: dict[ast.AST, list[ast.AST]] = {}
        #: Per scope (module, function, lambda, class): what its names stand for, the string
        #: constants assigned to them (one value, or all of them), and the names it binds.
        self.aliases: dict[ast.AST, dict[str, str]] = {}
        self.consts: dict[ast.AST, dict[str, Any]] = {}
        self.choices: dict[ast.AST, dict[str, list[Any]]] = {}
        self.bound: dict[ast.AST, set[str]] = {}
        #: String constants of classes and objects (``KEY = "CI"`` in a class, ``self.KEY = "CI"``).
        self.members: dict[str, Any] = {}
        self.declared: dict[ast.AST, set[str]] = {}
        self.chains: dict[ast.AST, list[ast.AST]] = {}
        self.functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda] = {}
        self.returning: dict[str, ast.expr] = {}
        self.import_bound: set[str] = set()
        self.starred: list[str] = []
        self.classes: set[str] = set()
        self.module_bound: set[str] = set()
        #: The names of the functions the walk is in.
        self.scopes: list[str] = []
        self.main_guard = 0
        self.ready = False
        self.qual_memo: dict[int, str | None] = {}
        self.fold_memo: dict[int, object] = {}
        self.following: set[str] = set()
        self.budget = _FOLD_BUDGET
        self._prepare(tree)
        self.ready = True

    # -- what names stand for ---------------------------------------------------------------------

    def _prepare(self, tree: ast.Module) -> None:
        """The parents of the nodes, the names each scope binds, its aliases and constants."""
        pairs: list[tuple[ast.AST, str, ast.expr]] = []  # (scope, name, value)
        loops: list[tuple[ast.AST, str, ast.expr]] = []

        def pair(scope: ast.AST, target: ast.expr, value: ast.expr) -> None:
            if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)):
                if len(target.elts) == len(value.elts):
                    for t, v in zip(target.elts, value.elts, strict=True):
                        pair(scope, t, v)
                return
            name = _dotted(target)
            if name is None:
                return
            pairs.append((tree if "." in name else scope, name, value))  # ``self.env``: the object's
            if isinstance(value, ast.Lambda) and isinstance(target, ast.Name):
                self.functions[target.id] = value
                self.returning[target.id] = value.body

        stack: list[ast.AST] = [tree]
        while stack:
            node = stack.pop()
            inner = node if isinstance(node, _SCOPES) else self.scope_of.get(node, tree)
            children = self.children[node] = list(ast.iter_child_nodes(node))
            for child in children:
                self.parents[child] = node
                self.scope_of[child] = inner
            stack += children
            kind = type(node)
            if kind not in _PREPARED or (kind is ast.Name and type(node.ctx) is ast.Load):  # type: ignore[attr-defined]
                continue
            self._binds(node)
            if isinstance(node, ast.Import):
                table = self.aliases.setdefault(self._scope(node), {})
                for alias in node.names:
                    bound = alias.asname or alias.name.split(".")[0]
                    table[bound] = alias.name if alias.asname else bound
                    self.import_bound.add(bound)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                table = self.aliases.setdefault(self._scope(node), {})
                for alias in node.names:
                    if alias.name != "*":
                        table[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                    else:
                        self.starred.append(_normalize(node.module))
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    pair(self._scope(node), target, node.value)
            elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
                pair(self._scope(node), node.target, node.value)
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                if isinstance(node.target, ast.Name):
                    loops.append((self._scope(node), node.target.id, node.iter))
            elif isinstance(node, ast.ClassDef):
                self.classes.add(node.name)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                positional = [*node.args.posonlyargs, *node.args.args]
                defaults = list(
                    zip(
                        positional[len(positional) - len(node.args.defaults) :],
                        node.args.defaults,
                        strict=True,
                    )
                )
                defaults += [
                    (a, d)
                    for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True)
                    if d is not None
                ]
                pairs += [(node, arg.arg, default) for arg, default in defaults]  # ``def f(k="CI")``
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[node.name] = node
                body = _body_without_docstring(node.body)
                if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
                    self.returning[node.name] = body[0].value
        for scope, names in self.declared.items():  # ``global x``: x is the module's
            self.bound.get(scope, set()).difference_update(names)
        self.module_bound = self.bound.get(tree, set())
        for _ in range(3):  # an alias of an alias of ..., a constant made of constants
            found: dict[tuple[ast.AST, str], list[object]] = {}
            for scope, name, value in pairs:
                folded = self._fold(value)
                if isinstance(folded, (str, bytes)):
                    found.setdefault((scope, name), []).append(folded)
            consts: dict[ast.AST, dict[str, Any]] = {}
            self.choices = {}
            for (scope, name), values in found.items():
                self.choices.setdefault(scope, {})[name] = list(dict.fromkeys(values))
                if len(set(values)) == 1:
                    consts.setdefault(scope, {})[name] = values[0]
            members = {k.rsplit(".", 1)[1]: v for k, v in consts.get(tree, {}).items() if "." in k}
            for scope, table in consts.items():
                if isinstance(scope, ast.ClassDef):
                    members.update(table)
            changed = consts != self.consts or members != self.members
            self.consts, self.members = consts, members
            for scope, name, value in pairs:
                qual = self._qual(value)
                table = self.aliases.setdefault(scope, {})
                known = table.get(name)
                if qual is not None and qual != known and (known is None or self._sensitive(qual)):
                    table[name] = qual
                    changed = True
            if not changed:
                break
        for scope, name, iterable in loops:
            folded = self._fold(iterable)
            if isinstance(folded, (list, tuple)) and all(isinstance(v, (str, bytes)) for v in folded):
                self.choices.setdefault(scope, {}).setdefault(name, []).extend(folded)

    def _binds(self, node: ast.AST) -> None:
        """Record the names ``node`` binds in its scope (its ancestors are known: the walk
        reaches a node after its parent)."""
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names = [node.id]
        elif isinstance(node, ast.arg):
            names = [node.arg]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [(a.asname or a.name).split(".")[0] for a in node.names]
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names = [node.name]
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names = []
        else:
            return
        scope = self._scope(node)
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            self.declared.setdefault(scope, set()).update(node.names)
        else:
            self.bound.setdefault(scope, set()).update(names)

    def _scope(self, node: ast.AST) -> ast.AST:
        """The scope (module, function, lambda, class) ``node`` is in."""
        return self.scope_of.get(node, self.tree)

    def _chain(self, node: ast.AST) -> list[ast.AST]:
        """The scopes a name at ``node`` is looked up in, innermost first (a class's only from
        its own body, as Python does)."""
        first = self._scope(node)
        if first not in self.chains:
            chain, scope = [first], first
            while scope is not self.tree:
                scope = self._scope(scope)
                if not isinstance(scope, ast.ClassDef):
                    chain.append(scope)
            self.chains[first] = chain
        return self.chains[first]

    def _scoped(self, tables: dict[ast.AST, dict[str, Any]], name: str, node: ast.AST) -> Any:
        """What ``tables`` hold for the name ``name`` at ``node``: ``_UNKNOWN`` for a name its
        scopes bind otherwise, ``_FREE`` for one they do not bind."""
        for scope in self._chain(node):
            table = tables.get(scope)
            if table is not None and name in table:
                return table[name]
            if name in self.bound.get(scope, ()):
                return _UNKNOWN
        return _FREE

    def _sensitive(self, qual: str) -> bool:
        top = qual.split(".")[0]
        return top in _SENSITIVE or top in _RUNNER_MODULES or qual in _USES

    def _name(self, name: str, node: ast.AST) -> str | None:
        """What the name ``name`` at ``node`` stands for (None: a local value)."""
        found = self._scoped(self.aliases, name, node)
        if found is _UNKNOWN:
            return None
        if found is not _FREE:
            return str(found)
        if name == "__builtins__":
            return "builtins"
        for module in self.starred:  # ``from os import *``: ``kill`` is ``os.kill``
            if f"{module}.{name}" in _STARRED_NAMES:
                return f"{module}.{name}"
        return f"builtins.{name}" if name in _BUILTIN_NAMES else None

    def _qual(self, node: ast.AST, depth: int = 0) -> str | None:
        """The qualified name of what ``node`` evaluates to (``os.environ``, ``builtins.eval``,
        ``pytest`` for ``sys.modules["pytest"]``), when the resolver can tell; else None."""
        if depth > _MAX_DEPTH:
            return None
        if self.ready and id(node) in self.qual_memo:
            return self.qual_memo[id(node)]
        qual = self._resolve(node, depth + 1)
        if qual is not None:
            qual = _normalize(qual)
        if self.ready:
            self.qual_memo[id(node)] = qual
        return qual

    def _resolve(self, node: ast.AST, depth: int) -> str | None:
        if isinstance(node, ast.Name):
            return self._name(node.id, node)
        if isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            objects = self.aliases.get(self.tree, {})
            if dotted is not None and "." in dotted and dotted in objects:
                return objects[dotted]
            base = self._qual(node.value, depth)
            if base is not None and node.attr == "__self__" and base.startswith("builtins."):
                return "builtins"  # ``len.__self__``: the builtins module
            return f"{base}.{node.attr}" if base is not None else None
        if isinstance(node, ast.Subscript):
            base = self._qual(node.value, depth)
            key = self._fold(node.slice, depth=depth)
            return self._lookup(base, key) if base is not None and isinstance(key, str) else None
        if isinstance(node, ast.NamedExpr):
            return self._qual(node.value, depth)
        if isinstance(node, ast.Call):
            return self._resolve_call(node, depth)
        return None

    def _resolve_call(self, node: ast.Call, depth: int) -> str | None:
        if isinstance(node.func, ast.Name) and node.func.id in self.returning:
            name = node.func.id
            if name in self.following:
                return None
            self.following.add(name)
            try:
                found = self._qual(self.returning[name], depth)
            finally:
                self.following.discard(name)
            if found is not None:
                return found
        func = self._qual(node.func, depth)
        if func is None:
            return None
        args = node.args
        first = self._fold(args[0], depth=depth) if args else _UNKNOWN
        if func in _IMPORTERS:
            if not isinstance(first, str) or not _MODULE_NAME.match(first):
                return None
            if func == "importlib.import_module":
                return first
            fromlist = (
                args[3]
                if len(args) > 3
                else next((k.value for k in node.keywords if k.arg == "fromlist"), None)
            )
            empty = fromlist is None or (isinstance(fromlist, ast.Constant) and not fromlist.value)
            return first.split(".")[0] if empty else first
        if func in ("builtins.getattr", "builtins.object.__getattribute__", "builtins.type.__getattribute__"):
            if len(args) >= 2:
                base, attr = self._qual(args[0], depth), self._fold(args[1], depth=depth)
                if base is not None and isinstance(attr, str):
                    return f"{base}.{attr}"
            return None
        if func.endswith(".__getattribute__") and isinstance(first, str):
            return f"{func[: -len('.__getattribute__')]}.{first}"
        if func == "builtins.vars":
            if not args:
                return "<globals>"
            base = self._qual(args[0], depth)
            return f"{base}.__dict__" if base is not None else None
        if func in ("builtins.globals", "builtins.locals"):
            return "<globals>"
        for method in (".get", ".__getitem__", ".pop"):
            if func.endswith(method) and isinstance(first, str):
                return self._lookup(func[: -len(method)], first)
        return None

    def _lookup(self, base: str, key: str) -> str | None:
        """What ``base[key]`` stands for, where ``base`` is a namespace."""
        if base == "sys.modules":
            return key
        if base == "<globals>":
            module = self.aliases.get(self.tree, {})
            if key in module:
                return module[key]
            if key == "__builtins__":
                return "builtins"
            return f"builtins.{key}" if key in _BUILTIN_NAMES and key not in self.module_bound else None
        if base.endswith(".__dict__"):
            return f"{base[: -len('.__dict__')]}.{key}"
        if base == "builtins":
            return f"builtins.{key}"
        return None

    # -- constant folding -------------------------------------------------------------------------

    def _fold(self, node: ast.AST, env: dict[str, Any] | None = None, depth: int = 0) -> Any:
        """The value of ``node`` when it is computed from constants only (else ``_UNKNOWN``)."""
        if depth > _MAX_DEPTH:
            return _UNKNOWN
        remember = env is None and self.ready
        if remember and id(node) in self.fold_memo:
            return self.fold_memo[id(node)]
        self.budget -= 1
        if self.budget < 0:  # a file built to keep the folder busy: what is left is unknown
            if self.budget == -1:
                reason = "computes constants too costly for the scan to fold (the rest is not folded)"
                self._hit(node, "dynamic", reason, key="the folding budget")
            return _UNKNOWN
        try:
            value = _sized(self._fold_node(node, env, depth + 1))
        except RecursionError:
            raise
        except Exception:  # an operation that fails on these constants: not a value
            value = _UNKNOWN
        if remember:
            self.fold_memo[id(node)] = value
        return value

    def _fold_node(self, node: ast.AST, env: dict[str, Any] | None, depth: int) -> Any:
        if isinstance(node, ast.Constant):
            constant = node.value
            return (
                constant if constant is None or isinstance(constant, (str, bytes, int, float)) else _UNKNOWN
            )
        if isinstance(node, ast.Name):
            if env is not None and node.id in env:
                return env[node.id]
            value = self._scoped(self.consts, node.id, node)
            return _UNKNOWN if value is _FREE else value
        if isinstance(node, ast.Attribute):  # ``self.KEY``, ``Config.KEY``: a class's constant
            dotted = _dotted(node)
            objects = self.consts.get(self.tree, {})
            if dotted is not None and dotted in objects:
                return objects[dotted]
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            if owner in ("self", "cls") or owner in self.classes:
                return self.members.get(node.attr, _UNKNOWN)
            return _UNKNOWN
        if isinstance(node, (ast.Tuple, ast.List)):
            items = [self._fold(e, env, depth) for e in node.elts]
            if any(v is _UNKNOWN for v in items):
                return _UNKNOWN
            return tuple(items) if isinstance(node, ast.Tuple) else items
        if isinstance(node, ast.BinOp):
            left, right = self._fold(node.left, env, depth), self._fold(node.right, env, depth)
            return _UNKNOWN if _UNKNOWN in (left, right) else _binop(node.op, left, right)
        if isinstance(node, ast.UnaryOp):
            value = self._fold(node.operand, env, depth)
            if value is _UNKNOWN:
                return _UNKNOWN
            if isinstance(node.op, ast.Not):
                return not value
            if isinstance(node.op, ast.USub):
                return -value
            if isinstance(node.op, ast.Invert):
                return ~value
            return +value
        if isinstance(node, ast.BoolOp):
            result: object = _UNKNOWN
            for part in node.values:
                result = self._fold(part, env, depth)
                if result is _UNKNOWN:
                    return _UNKNOWN
                if bool(result) == isinstance(node.op, ast.Or):
                    return result
            return result
        if isinstance(node, ast.Compare):
            left = self._fold(node.left, env, depth)
            for op, right_node in zip(node.ops, node.comparators, strict=True):
                right = self._fold(right_node, env, depth)
                if _UNKNOWN in (left, right):
                    return _UNKNOWN
                if not _COMPARE[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            test = self._fold(node.test, env, depth)
            if test is _UNKNOWN:
                return _UNKNOWN
            return self._fold(node.body if test else node.orelse, env, depth)
        if isinstance(node, ast.JoinedStr):
            return self._fold_fstring(node, env, depth)
        if isinstance(node, ast.Subscript):
            value = self._fold(node.value, env, depth)
            if not isinstance(value, (str, bytes, list, tuple)):
                return _UNKNOWN
            if isinstance(node.slice, ast.Slice):
                bounds = [
                    None if part is None else self._fold(part, env, depth)
                    for part in (node.slice.lower, node.slice.upper, node.slice.step)
                ]
                if any(b is not None and not isinstance(b, int) for b in bounds):
                    return _UNKNOWN
                return value[slice(*bounds)]
            index = self._fold(node.slice, env, depth)
            return value[index] if isinstance(index, int) else _UNKNOWN
        if isinstance(node, ast.Call):
            return self._fold_call(node, env, depth)
        if isinstance(node, (ast.GeneratorExp, ast.ListComp)):
            return self._fold_comprehension(node, env, depth)
        if isinstance(node, ast.NamedExpr):
            return self._fold(node.value, env, depth)
        return _UNKNOWN

    def _fold_fstring(self, node: ast.JoinedStr, env: dict[str, Any] | None, depth: int) -> Any:
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                parts.append(value.value)
                continue
            if not isinstance(value, ast.FormattedValue):
                return _UNKNOWN
            inner = self._fold(value.value, env, depth)
            spec = "" if value.format_spec is None else self._fold(value.format_spec, env, depth)
            if inner is _UNKNOWN or not isinstance(spec, str) or _WIDE_FORMAT.search(spec):
                return _UNKNOWN
            converted = {-1: inner, 115: str(inner), 114: repr(inner), 97: ascii(inner)}[value.conversion]
            parts.append(format(converted, spec))
        return "".join(parts)

    def _fold_call(self, node: ast.Call, env: dict[str, Any] | None, depth: int) -> Any:
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            return _UNKNOWN
        args = [self._fold(a, env, depth) for a in node.args]
        kwargs = {k.arg: self._fold(k.value, env, depth) for k in node.keywords if k.arg is not None}
        if _UNKNOWN in args or _UNKNOWN in kwargs.values():
            return _UNKNOWN
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _TEXT_METHODS:
            receiver = self._fold(func.value, env, depth)
            if isinstance(receiver, (str, bytes)):
                return _text_method(receiver, func.attr, args, kwargs)
        qual = self._qual(func, depth)
        if qual is None:
            return _UNKNOWN
        if qual in _PURE:
            return _PURE[qual](*args, **kwargs)
        owner, _, method = qual.rpartition(".")
        if owner in ("builtins.str", "builtins.bytes") and method in _TEXT_METHODS and args:
            receiver = args[0]
            if isinstance(receiver, (str, bytes)):
                return _text_method(receiver, method, args[1:], kwargs)
        return _UNKNOWN

    def _fold_comprehension(
        self, node: ast.GeneratorExp | ast.ListComp, env: dict[str, Any] | None, depth: int
    ) -> Any:
        if len(node.generators) != 1:
            return _UNKNOWN
        loop = node.generators[0]
        if loop.is_async or not isinstance(loop.target, ast.Name):
            return _UNKNOWN
        items = self._fold(loop.iter, env, depth)
        if not isinstance(items, (str, bytes, list, tuple)):
            return _UNKNOWN
        out = []
        for item in items:
            scope = {**(env or {}), loop.target.id: item}
            keep = [self._fold(cond, scope, depth) for cond in loop.ifs]
            if _UNKNOWN in keep:
                return _UNKNOWN
            if all(keep):
                value = self._fold(node.elt, scope, depth)
                if value is _UNKNOWN:
                    return _UNKNOWN
                out.append(value)
        return out

    def _choices(self, node: ast.AST) -> list[Any]:
        """The values ``node`` may have: a name assigned several constants or looped over a
        constant list has them all."""
        if isinstance(node, ast.Name):
            values = self._scoped(self.choices, node.id, node)
            if isinstance(values, list):
                return values
        return [self._fold(node)]

    def _encoded(self, node: ast.AST) -> bool:
        """Whether ``node`` decodes or reverses its text (a name hidden from a reader)."""
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call):
                if isinstance(sub.func, ast.Attribute) and sub.func.attr in ("decode", "fromhex"):
                    return True
                if self._qual(sub.func) in _DECODERS:
                    return True
            if (
                isinstance(sub, ast.Subscript)
                and isinstance(sub.slice, ast.Slice)
                and sub.slice.step is not None
            ):
                return True
        return False

    def _static(self, node: ast.expr | None) -> Any:
        """The value (or for ``and``/``or``, the truth) ``node`` always has, else ``_UNKNOWN``."""
        if node is None:
            return None
        if isinstance(node, ast.Name) and node.id == "NotImplemented":
            return _NOT_IMPLEMENTED
        if isinstance(node, ast.BoolOp):
            values = [self._static(v) for v in node.values]
            deciding = isinstance(node.op, ast.Or)
            if any(v is not _UNKNOWN and v is not _NOT_IMPLEMENTED and bool(v) == deciding for v in values):
                return deciding
        if isinstance(node, ast.IfExp):
            body, orelse = self._static(node.body), self._static(node.orelse)
            if body is not _UNKNOWN and repr(body) == repr(orelse):
                return body
        return self._fold(node)

    # -- findings ---------------------------------------------------------------------------------

    def _hit(self, node: ast.AST, rule: str, reason: str, key: str | None = None) -> None:
        text = key if key is not None else _unparse(node)
        self.hits.append(_Hit(getattr(node, "lineno", 1), rule, _clean(reason), f"{rule}\0{text}"))

    def findings(self) -> list[_Hit]:
        """The hits, one per line and rule (the first, most specific, one)."""
        seen: set[tuple[int, str]] = set()
        kept = []
        for hit in self.hits:
            if (hit.line, hit.rule) not in seen:
                seen.add((hit.line, hit.rule))
                kept.append(hit)
        return kept

    def _exit_allowed(self) -> bool:
        """In a main block, or in a function named as a program's entry point (``main``, ``cli``,
        ``run_main``, ``console_main``, ...), where exits and the command line belong."""
        return self.main_guard > 0 or any(_ENTRY_POINT.match(scope) for scope in self.scopes)

    def _module(self, name: str, node: ast.AST, verb: str) -> None:
        """Findings for a module imported or looked up by ``name``."""
        parts = name.split(".")
        shown = _show_name(name)
        if parts[0] in _RUNNER_MODULES and not (parts[0] == "doctest" and self.main_guard):
            self._hit(node, "runner", f"{verb} the test runner module {shown}")
        elif _is_test_module(name):
            self._hit(node, "runner", f"{verb} the test module {shown}")
        if parts[0] == "atexit":
            self._hit(node, "exit", f"{verb} atexit (at-exit hooks)")
        if parts[0] in ("ctypes", "_ctypes"):
            self._hit(node, "interpreter", f"{verb} {shown} (raw memory access)")
        if parts[0] == "__main__":
            self._hit(node, "interpreter", f"{verb} the __main__ module")
        if name.startswith(("importlib.abc", "importlib.machinery")):
            self._hit(node, "interpreter", f"{verb} {shown} (import machinery)")

    def _identifier(self, name: str, node: ast.AST, key: str | None = None, defines: bool = False) -> None:
        if name.startswith("pytest_"):
            what = "defines the pytest hook" if defines else "names the pytest hook or plugin variable"
            self._hit(node, "runner", f"{what} {name}", key)
        elif name in _RUNNER_NAMES:
            self._hit(node, "runner", f"names the test runner internal {name}", key)
        if "CLOVER_" in name or "clover_live" in name.lower():
            self._hit(node, "runner", f"names Clover's own {name}", key)

    def _attribute_name(self, attr: str, node: ast.AST, base: ast.AST, store: bool) -> None:
        """Findings for an attribute ``attr`` of ``base`` (read, or set when ``store``)."""
        self._identifier(attr, node)
        if attr in _FRAME_ATTRS:
            self._hit(node, "interpreter", f"reads .{attr} (stack introspection)")
        if attr in _DISTINCT_ATTRS:
            rule, why = _DISTINCT_ATTRS[attr]
            self._hit(node, rule, f"uses .{attr} ({why})")
        if attr == "hook" and (_dotted(base) or "").lower().endswith("config"):
            self._hit(node, "runner", "reaches pytest's hooks through config.hook")
        if attr == "outcome" and store and not (isinstance(base, ast.Name) and base.id in ("self", "cls")):
            self._hit(node, "runner", "sets .outcome on an object (rewrites a test report)")
        if attr == "__code__" and store:
            self._hit(node, "dynamic", "replaces a function's __code__")
        if attr == "replace" and isinstance(base, ast.Attribute) and base.attr == "__code__":
            self._hit(node, "dynamic", "rewrites a code object (__code__.replace)")

    def _text_found(self, value: object, node: ast.AST, built: bool) -> None:
        """Findings for a string the code has (or builds)."""
        text = _text(value)
        if text is None:
            return
        if _PROC.search(text):
            self._hit(node, "interpreter", f"names {_show(text)} (the process's own /proc entries)")
        if _SANDBOX_TEXT.search(text):
            self._hit(node, "environment", f"names {_show(text)}, a sign of the sandbox the tests run in")
        if _FRAME_TEXT.search(text):
            self._hit(
                node, "interpreter", f"names a frame's attribute in {_show(text)} (stack introspection)"
            )
        if "CLOVER_" in text or "clover_live" in text.lower():
            self._hit(node, "runner", f"names Clover's own {_show(text)}")
        elif text.endswith(".py") and len(text) < 200 and " " not in text and is_test_file(text.lstrip("./")):
            self._hit(node, "runner", f"names the test file {_show(text)}")
        elif _ENV_SHAPE.match(text):
            verb = "builds the string" if built else "names"
            self._hit(node, "environment", f"{verb} {_show(text)}, a test runner's environment variable")

    def _environment_key(self, key: ast.AST, node: ast.AST) -> None:
        """Findings for a read of the environment variable ``key``."""
        for value in self._choices(key):
            text = _text(value)
            upper = text.upper() if text is not None else ""
            if text is not None and (upper == "CI" or upper.startswith(_ENV_PREFIXES)):
                if isinstance(key, (ast.Constant, ast.Name, ast.Attribute)):
                    reason = f"reads the test runner's environment variable {_show(text)}"
                else:
                    reason = f"builds the string {_show(text)} and reads it from the environment"
                self._hit(node, "environment", reason)
                return

    def _whole_environment(self, node: ast.AST, qual: str) -> None:
        """A finding for the environment used as a whole (not one variable of it)."""
        parent = self.parents.get(node)
        if isinstance(parent, (ast.Attribute, ast.Subscript)) and parent.value is node:
            return  # one variable, or a method: seen where the method is
        if isinstance(parent, ast.Compare):
            return  # ``"X" in os.environ`` (seen in the comparison), ``env is None``
        if isinstance(parent, ast.keyword) and parent.arg is not None:
            return  # ``env=os.environ``: handed on to a child process
        if isinstance(parent, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and parent.value is node:
            return  # an alias, followed where it is used
        if isinstance(parent, ast.arguments):
            return  # a parameter's default: an alias too
        self._hit(node, "environment", f"reads the whole environment ({qual})")

    def _uses(self, node: ast.AST, qual: str) -> None:
        """Findings for a use of ``qual`` at ``node``."""
        if qual in _USES:
            rule, why = _USES[qual]
            self._hit(node, rule, f"uses {qual.removeprefix('builtins.')} ({why})")
        elif qual == "sys.argv":
            if not self._exit_allowed():
                self._hit(
                    node,
                    "environment",
                    "reads sys.argv outside a main block or main() (the test runner's command line)",
                )
        elif qual in _SOFT_EXITS:
            if not self._exit_allowed():
                self._hit(
                    node, "exit", f"uses {qual.removeprefix('builtins.')} outside a main block or main()"
                )
        elif qual == "builtins.__import__":
            parent = self.parents.get(node)
            if not (isinstance(parent, ast.Call) and parent.func is node):
                self._hit(node, "dynamic", "takes __import__ as a value (an import by computed name)")
        elif qual == "builtins":
            self._builtins_module(node)
        elif qual in _LOOKED_UP and not (isinstance(node, ast.Name) and node.id in self.import_bound):
            self._module(qual, node, "looks up")
        if qual in _ENVIRON and isinstance(getattr(node, "ctx", ast.Load()), ast.Load):
            self._whole_environment(node, qual)

    def _builtins_module(self, node: ast.AST) -> None:
        if isinstance(node, ast.Name) and node.id == "__builtins__":
            self._hit(node, "interpreter", "uses __builtins__")
            return
        if isinstance(node, (ast.Call, ast.Subscript)):
            self._hit(node, "dynamic", "reaches the builtins module through a lookup")
            return
        parent = self.parents.get(node)
        if (
            isinstance(parent, ast.Attribute)
            and parent.value is node
            and isinstance(parent.ctx, ast.Load)
            and not parent.attr.startswith("__")
        ):
            return  # ``builtins.open``: the attribute is judged itself
        if (
            isinstance(parent, ast.Call)
            and self._qual(parent.func) in ("builtins.getattr", "builtins.hasattr")
            and len(parent.args) >= 2
            and parent.args[0] is node
            and isinstance(self._fold(parent.args[1]), str)
        ):
            return  # ``getattr(builtins, "name")``: as ``builtins.name``
        self._hit(node, "interpreter", "uses the builtins module as an object")

    def _replaced(self, qual: str, node: ast.AST) -> None:
        """Findings for assigning (or deleting) ``qual``."""
        if qual in _REPLACED:
            self._hit(node, "interpreter", f"replaces {qual}")
        elif qual.startswith("builtins.") and qual.count(".") == 1:
            self._hit(
                node, "interpreter", f"replaces the builtin {_show_name(qual.removeprefix('builtins.'))}"
            )

    def _constant_method(
        self, fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, name: str
    ) -> str | None:
        """How ``fn``, as the method ``name``, answers without comparing anything (None: it
        does compare)."""
        first: ast.expr | None
        if isinstance(fn, ast.Lambda):
            unconditional, first = True, fn.body
            results: list[ast.expr | None] = [fn.body]
        else:
            body = _body_without_docstring(fn.body)
            if not body:
                return None
            unconditional = isinstance(body[0], ast.Return)
            first = body[0].value if isinstance(body[0], ast.Return) else None
            results = _returns(fn)
            if not any(r is not None for r in results):
                return None  # a stub (``...``), or one that only raises: no answer given
            if _falls_off(body):
                results.append(None)
        if unconditional:
            value = self._static(first)
            if value is not _UNKNOWN and value is not _NOT_IMPLEMENTED:
                return f"always returns {_show(value)}"
        values = [self._static(r) for r in results]
        same = values and len({repr(v) for v in values}) == 1
        if same and values[0] is not _UNKNOWN and values[0] is not _NOT_IMPLEMENTED:
            return f"always returns {_show(values[0])}"
        if name in _OPERAND_DUNDERS:
            other = _other_parameter(fn.args)
            answers = [v for v in values if v is not _NOT_IMPLEMENTED and v is not None]
            if other is not None and answers and not _reads(fn, other):
                return f"never looks at the other operand {other!r}"
            positional = [*fn.args.posonlyargs, *fn.args.args]
            own = positional[0].arg if positional else None
            if own is not None and other is not None and answers and not _reads(fn, own):
                return f"never looks at its own value {own!r}"
        return None

    def _method_value(self, value: ast.AST, name: str, node: ast.AST, where: str) -> None:
        """A finding when ``value`` (set as the dunder ``name``) answers without comparing."""
        fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | None = None
        if isinstance(value, ast.Lambda):
            fn = value
        elif isinstance(value, ast.Name):
            fn = self.functions.get(value.id)
        elif name in _OPERAND_DUNDERS and (
            isinstance(value, ast.Call) or (_dotted(value) or "").startswith(("operator.", "_operator."))
        ):
            shown = _clean(_unparse(value))[:80]
            self._hit(node, "comparison", f"sets {name} to {shown}, not a method that compares {where}")
            return
        if fn is None:
            return
        why = self._constant_method(fn, name)
        if why is not None:
            self._hit(node, "comparison", f"sets {name} to a function that {why} {where}")

    # -- the walk ---------------------------------------------------------------------------------

    def walk(self, tree: ast.Module) -> None:
        """Visit every node of ``tree``, parents before children, without recursing (a deep
        expression is no deeper a stack): a ``visit_*`` method checks its node and returns its
        children to visit, with callbacks among them, or None for all of them in order."""
        stack: list[ast.AST | Callable[[], object]] = [tree]
        while stack:
            item = stack.pop()
            if not isinstance(item, ast.AST):
                item()
                continue
            method = getattr(self, f"visit_{type(item).__name__}", None)
            children = method(item) if method is not None else None
            stack.extend(reversed(self.children.get(item, []) if children is None else children))

    def visit_Import(self, node: ast.Import) -> _Children:
        for alias in node.names:
            self._module(alias.name, alias, "imports")
            if alias.asname:
                self._identifier(alias.asname, alias)
        return None

    def visit_ImportFrom(self, node: ast.ImportFrom) -> _Children:
        module = node.module or ""
        if module:
            self._module(module, node, "imports")
        for alias in node.names:
            full = f"{module}.{alias.name}".lstrip(".")
            if alias.name.startswith("test_") or alias.name in ("tests", "conftest"):
                self._module(full, alias, "imports")  # ``from tests import test_calc``
            elif node.level == 0 and full.startswith("importlib."):
                self._module(full, alias, "imports")  # ``from importlib import machinery``
            self._identifier(alias.asname or alias.name, alias)
            if node.level == 0 and _normalize(full) in _USES:
                self._uses(alias, _normalize(full))
        return None

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> _Children:
        self._identifier(node.name, node, key=f"def {node.name}", defines=True)
        self.scopes.append(node.name)
        return [*self.children.get(node, []), self.scopes.pop]

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> _Children:
        self.scopes.append("<lambda>")
        return [*self.children.get(node, []), self.scopes.pop]

    def visit_ClassDef(self, node: ast.ClassDef) -> _Children:
        self._identifier(node.name, node, key=f"class {node.name}")
        for stmt in node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name in _CMP_DUNDERS:
                why = self._constant_method(stmt, stmt.name)
                if why is not None:
                    self._hit(stmt, "comparison", f"defines {stmt.name} that {why} in class {node.name}")
            elif isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    if isinstance(target, ast.Name) and target.id in _CMP_DUNDERS:
                        self._method_value(stmt.value, target.id, stmt, f"in class {node.name}")
        return None

    def visit_If(self, node: ast.If) -> _Children:
        if not _is_main_guard(node.test):
            return None
        return [node.test, self._enter_main, *node.body, self._leave_main, *node.orelse]

    def _enter_main(self) -> None:
        self.main_guard += 1

    def _leave_main(self) -> None:
        self.main_guard -= 1

    def visit_Name(self, node: ast.Name) -> _Children:
        if isinstance(node.ctx, ast.Store):
            if node.id in ("__builtins__", "__import__"):
                self._hit(node, "interpreter", f"rebinds {node.id}")
            self._identifier(node.id, node)
            return []
        qual = self._qual(node)
        if qual is not None:
            self._uses(node, qual)
        self._identifier(node.id, node)
        return None

    def visit_Attribute(self, node: ast.Attribute) -> _Children:
        store = not isinstance(node.ctx, ast.Load)
        base = self._qual(node.value)
        if store:  # what is replaced: not what an alias of the same name stands for
            qual = _normalize(f"{base}.{node.attr}") if base is not None else None
        else:
            qual = self._qual(node)
        if qual is not None:
            self._uses(node, qual)
            if store:
                self._replaced(qual, node)
        self._attribute_name(node.attr, node, node.value, store)
        if base in _ENVIRON and node.attr in _ENV_WHOLE:
            self._hit(node, "environment", f"reads the whole environment ({base}.{node.attr})")
        if base in _ENVIRON and node.attr in _ENV_WRITE:
            self._hit(node, "interpreter", f"changes the environment ({base}.{node.attr})")
        return None

    def visit_Subscript(self, node: ast.Subscript) -> _Children:
        base = self._qual(node.value)
        if base in _ENVIRON:
            if isinstance(node.ctx, ast.Load):
                self._environment_key(node.slice, node)
            else:
                self._hit(node, "interpreter", f"changes the environment ({base}[...])")
        elif base == "sys.modules":
            for value in self._choices(node.slice):
                if isinstance(value, str):
                    self._module(value, node, "looks up")
        if isinstance(node.ctx, ast.Store):
            key = self._fold(node.slice)
            parent = self.parents.get(node)
            if isinstance(key, str) and key in _CMP_DUNDERS and isinstance(parent, ast.Assign):
                self._method_value(parent.value, key, node, "in a class namespace")
        qual = self._qual(node)
        if qual is not None:
            self._uses(node, qual)
        self._text_found(self._fold(node), node, built=True)
        return None

    def visit_Call(self, node: ast.Call) -> _Children:
        func = self._qual(node.func)
        args = node.args
        if func in _IMPORTERS or func in _FINDERS:
            self._import_call(node, func)
        elif func in _ATTR_FUNCS:
            self._attribute_call(node, func)
        elif func in _ENV_GETTERS and args:
            self._environment_key(args[0], node)
        elif func is not None and func.startswith("sys.modules.") and args:
            for value in self._choices(args[0]):
                if isinstance(value, str):
                    self._module(value, node, "looks up")
        elif func == "builtins.vars" and args:
            base = self._qual(args[0])
            if base is not None and base.split(".")[0] in _SENSITIVE:
                self._hit(node, "dynamic", f"reads the namespace of {_show_name(base)} (vars)")
        elif func in _FD_WRITERS and args:
            fd = self._fold(args[0])
            stream = _dotted(args[0].func) if isinstance(args[0], ast.Call) else None
            if fd in (1, 2) or stream in ("sys.stdout.fileno", "sys.stderr.fileno"):
                self._hit(node, "interpreter", f"uses {func} on the process's standard output or error")
        elif func == "faulthandler.dump_traceback_later":
            exits = next((k.value for k in node.keywords if k.arg == "exit"), None)
            if exits is not None and self._fold(exits) is not False and self._fold(exits) != 0:
                self._hit(node, "exit", "makes faulthandler end the process (dump_traceback_later exit=True)")
        elif func in _PICKLE_LOADS and args and isinstance(self._fold(args[0]), bytes):
            self._hit(node, "dynamic", f"unpickles a constant ({func})")
        elif func in _PATTERN_TESTS and args:
            self._runner_text(args[0], node)
        if isinstance(node.func, ast.Attribute) and node.func.attr in _TEXT_TESTS:
            for part in [node.func.value, *args]:
                self._runner_text(part, node)
        for keyword in node.keywords:
            if keyword.arg in _CMP_DUNDERS:
                self._method_value(keyword.value, keyword.arg, node, "in a class built at run time")
        qual = self._qual(node)
        if qual is not None:
            self._uses(node, qual)
        self._text_found(self._fold(node), node, built=True)
        return None

    def _import_call(self, node: ast.Call, func: str) -> None:
        target = (
            node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "name"), None)
        )
        if target is None:
            return
        names = [v for v in self._choices(target) if isinstance(v, str)]
        verb = "imports" if func in _IMPORTERS else "looks for"
        if not names:
            if func in _IMPORTERS:
                self._hit(node, "dynamic", f"imports a module whose name is computed at run time ({func})")
            return
        for name in names:
            self._module(name, node, verb)
        if not isinstance(target, ast.Constant) and self._encoded(target):
            self._hit(node, "dynamic", f"decodes the module name {_show(names[0])} from an encoded constant")

    def _attribute_call(self, node: ast.Call, func: str) -> None:
        args = node.args
        if len(args) < 2:
            return
        name = self._fold(args[1])
        base = self._qual(args[0])
        store = func in ("builtins.setattr", "builtins.delattr")
        if not isinstance(name, str):
            if base is not None and (base in _SENSITIVE or base.split(".")[0] in _SENSITIVE - {"builtins"}):
                self._hit(node, "dynamic", f"looks up an attribute of {_show_name(base)} by a computed name")
            return
        self._attribute_name(name, node, args[0], store)
        if not isinstance(args[1], ast.Constant) and self._encoded(args[1]):
            self._hit(node, "dynamic", f"decodes the attribute name {_show(name)} from an encoded constant")
        if base is not None and store:
            qual = _normalize(f"{base}.{name}")
            self._uses(node, qual)
            self._replaced(qual, node)
        if func == "builtins.setattr" and name in _CMP_DUNDERS and len(args) >= 3:
            self._method_value(args[2], name, node, f"on {_dotted(args[0]) or 'a class'}")

    def _runner_text(self, node: ast.AST, where: ast.AST) -> None:
        for value in self._choices(node):
            text = _text(value)
            if text is not None and _RUNNER_TEXT.search(text):
                self._hit(where, "runner", f"checks a string against {_show(text)} (detects the test runner)")
                return

    def visit_Compare(self, node: ast.Compare) -> _Children:
        operands = [node.left, *node.comparators]
        for i, op in enumerate(node.ops):
            left, right = operands[i], operands[i + 1]
            container = self._qual(right) if isinstance(op, (ast.In, ast.NotIn)) else None
            if container in _ENVIRON:
                self._environment_key(left, node)
            elif container == "sys.modules":
                for value in self._choices(left):
                    if isinstance(value, str):
                        self._module(value, node, "looks for")
            elif isinstance(op, (ast.In, ast.NotIn, ast.Eq, ast.NotEq)):
                self._runner_text(left, node)
                self._runner_text(right, node)
        return None

    def visit_Assign(self, node: ast.Assign) -> _Children:
        for target in node.targets:
            if isinstance(target, ast.Attribute) and target.attr in _CMP_DUNDERS:
                self._method_value(node.value, target.attr, node, f"on {_dotted(target.value) or 'a class'}")
        return None

    def visit_Dict(self, node: ast.Dict) -> _Children:
        for key, value in zip(node.keys, node.values, strict=True):
            if key is None:
                continue
            name = self._fold(key)
            if isinstance(name, str) and name in _CMP_DUNDERS:
                self._method_value(value, name, value, "in a class built at run time")
        return None

    def visit_Raise(self, node: ast.Raise) -> _Children:
        raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        if raised is not None and self._qual(raised) == "builtins.SystemExit" and not self._exit_allowed():
            self._hit(node, "exit", "raises SystemExit outside a main block or main()")
        return None

    def visit_Constant(self, node: ast.Constant) -> _Children:
        if isinstance(node.value, (str, bytes)):
            self._text_found(node.value, node, built=False)
        return []

    def visit_BinOp(self, node: ast.BinOp) -> _Children:
        self._text_found(self._fold(node), node, built=True)
        return None

    def visit_JoinedStr(self, node: ast.JoinedStr) -> _Children:
        self._text_found(self._fold(node), node, built=True)
        return None


def _scan(data: bytes) -> tuple[list[_Hit] | None, int, str]:
    """The findings in one file, or (None, line, why) when it cannot be read as Python."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # invalid escapes and the like: not ours to report
        try:
            tree = ast.parse(data)
        except SyntaxError as error:
            return None, error.lineno or 1, f"no longer parses ({error.msg})"
        except (ValueError, RecursionError, MemoryError) as error:
            return None, 1, f"no longer parses ({type(error).__name__})"
    try:
        scanner = _Scanner(tree)
        scanner.walk(tree)
    except RecursionError:
        return None, 1, "is nested too deeply to scan"
    return scanner.findings(), 0, ""


def _changed_lines(old: bytes | None, new: bytes) -> set[int]:
    """The lines of ``new`` (1-based) that are not in ``old`` as they were."""
    after = new.splitlines()
    if old is None:
        return set(range(1, len(after) + 1))
    before = old.splitlines()
    start = 0
    while start < min(len(before), len(after)) and before[start] == after[start]:
        start += 1
    end = 0
    while end < min(len(before), len(after)) - start and before[-1 - end] == after[-1 - end]:
        end += 1
    matcher = difflib.SequenceMatcher(
        None, before[start : len(before) - end], after[start : len(after) - end], False
    )
    return {
        start + j + 1 for tag, _, _, j1, j2 in matcher.get_opcodes() if tag != "equal" for j in range(j1, j2)
    }


def _new_findings(path: str, old: bytes | None, new: bytes) -> list[Finding]:
    hits, line, why = _scan(new)
    was = _scan(old) if old is not None else ([], 0, "")
    if hits is None:
        if old is None or was[0] is not None:
            why = why.replace("no longer parses", "does not parse") if old is None else why
            return [Finding(path, line, "unparsable", _clean(why[:200]))]
        return []
    before = Counter(hit.key for hit in was[0] or [])
    groups: dict[str, list[_Hit]] = {}
    for hit in hits:
        groups.setdefault(hit.key, []).append(hit)
    changed: set[int] | None = None
    found = []
    for key, group in groups.items():
        extra = len(group) - before[key]
        if extra <= 0:
            continue
        if extra < len(group):  # which of the like ones are new: those on the lines the patch changed
            changed = _changed_lines(old, new) if changed is None else changed
            group = sorted(group, key=lambda h: (h.line not in changed, h.line))
        found += [Finding(path, h.line, h.rule, h.reason) for h in group[:extra]]
    return found


def scan_changes(before: dict[str, bytes | None], after: dict[str, bytes | None]) -> list[Finding]:
    """What the patch adds to the code under test that could fake a pass (the module's rules), sorted
    by path and line. A finding asks for review; it does not prove intent.

    - ``before`` / ``after``: the bytes of each changed ``.py`` file (None: absent on that side).

    Test files and conftests are not scanned: the held-out run puts back what judges the patch.

    A finding counts only when the patch adds it: its rule and the text of its node (``ast``, without
    line numbers) occur more often after the change than before; among like ones, those on changed
    lines are named. A file that no longer parses gives one ``unparsable`` finding, when it parsed
    before (or is new).

    Names are followed through imports, simple aliases (``e = os.environ``, ``g = getattr``,
    ``self.env = os.environ``, one-line functions returning them) and lookups by a constant name
    (``getattr``, ``sys.modules``, ``__import__``, ``vars``, ``globals()``). Strings are folded where
    no project code must run: concatenation, ``%``, ``format``, f-strings, joins, slices and reversal,
    case changes, ``chr`` and ``bytes`` of constants, hex, base64, rot13 and zlib decoding.
    """
    found: list[Finding] = []
    for path in sorted(after):
        data = after[path]
        if data is None or not path.endswith(".py") or is_test_file(path):
            continue
        found += _new_findings(path, before.get(path), data)
    return sorted(found, key=lambda f: (f.path, f.line, f.rule, f.reason))
