"""A second, independent run of pytest-style tests: no pytest, a fresh process, other names.

Code that looks for pytest (its modules, environment variables, the caller's frame, file or name)
answers right only under pytest. This runner runs the target tests again in a process of its own:
it strips the runners' environment variables before any workspace code runs, takes pytest's
modules out of ``sys.modules`` while a test runs, imports each test module under a fresh random
name compiled from a fresh file name, calls each test renamed, and runs unittest cases through
unittest. Results come back over the signed channel of :mod:`.guarded`. Tests it cannot run
faithfully (other fixtures, parametrized, async, marked, autouse) are reported as not run, with why.
"""

from __future__ import annotations

import secrets
import shlex
from dataclasses import dataclass, field

from clover_agent.sandboxes.base import WORKSPACE, Sandbox
from clover_agent.sandboxes.tempdir import private_temp_dir
from clover_agent.tools.run_tests import guarded as guard

#: Why a test was not run, by the code the runner sends.
NOT_RUN = {
    "fixtures": "it needs pytest fixtures this runner does not provide",
    "parametrized": "it is parametrized",
    "async": "it is a coroutine",
    "marked": "it carries pytest marks (usefixtures, skip, xfail, ...)",
    "autouse": "an autouse fixture applies to it",
    "import": "a conftest.py above it could not be imported without pytest",
    "notfound": "the runner could not find it by its id",
    "unsupported": "its kind of test is not one this runner runs",
    "plugins": "a pytest plugin of the environment sets the process up first (Django, environment variables, ...)",
}

RUNNER = (
    guard.CHANNEL_SOURCE
    + r"""
SETTING_UP = ("pytest_django", "pytest_env", "pytest_dotenv", "pytest_flask", "pytestqt")


def _independent():
    import os, sys
    private, key_file = sys.argv.pop(1), sys.argv.pop(1)
    ids = [i for i in sys.argv[1:] if i != "--"]
    del sys.argv[1:]
    send, off = _channel(key_file)
    for name in list(os.environ):
        if name.upper().startswith(("PYTEST", "_PYTEST", "CLOVER", "COV_CORE", "TOX_", "NOSE")):
            del os.environ[name]
    here = os.getcwd()
    sys.path[:] = [p for p in sys.path if p not in ("", here, ".")]
    # only what every run needs is imported here (the rest when a test needs it: this is timed)
    import ast, importlib, importlib.util, traceback, types

    def fresh(prefix):
        return prefix + os.urandom(6).hex()

    def ini_pythonpath():
        found = []
        if os.path.isfile("pyproject.toml"):
            try:
                import tomllib
                with open("pyproject.toml", "rb") as handle:
                    table = tomllib.load(handle).get("tool", {}).get("pytest", {})
                value = table.get("ini_options", table).get("pythonpath", [])
                found += value.split() if isinstance(value, str) else [str(v) for v in value]
            except Exception:
                pass
        for name, section in (("pytest.ini", "pytest"), ("tox.ini", "pytest"), ("setup.cfg", "tool:pytest")):
            if os.path.isfile(name):
                import configparser
                parser = configparser.ConfigParser(interpolation=None)
                try:
                    parser.read(name)
                    found += parser.get(section, "pythonpath", fallback="").split()
                except configparser.Error:
                    pass
        return [os.path.join(here, p) for p in found]

    class LazyPytest(types.ModuleType):
        # pytest as a test module imports it, loaded only when a test first uses it

        def __getattr__(self, name):
            if name.startswith("__") and name.endswith("__"):
                raise AttributeError(name)
            if sys.modules.get("pytest") is self:
                del sys.modules["pytest"]
            real = importlib.import_module("pytest")
            self.__dict__.update(real.__dict__)
            return getattr(real, name)

    if importlib.util.find_spec("pytest") is not None:
        sys.modules["pytest"] = LazyPytest("pytest")

    def basedir(folder):
        while os.path.isfile(os.path.join(folder, "__init__.py")):
            folder = os.path.dirname(folder)
        return folder

    def dotted(path):
        folder, name = os.path.split(os.path.abspath(path))
        parts = [name[:-3]] if name != "__init__.py" else []
        while os.path.isfile(os.path.join(folder, "__init__.py")):
            folder, part = os.path.split(folder)
            parts.insert(0, part)
        return ".".join(parts)

    def load(path):
        with open(path, "rb") as handle:
            source = handle.read()
        tree = ast.parse(source, path)
        relative = any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree))
        folder = basedir(os.path.dirname(os.path.abspath(path)))
        if folder not in sys.path:
            sys.path.insert(0, folder)
        if relative:
            return importlib.import_module(dotted(path)), source
        name = fresh("m_")
        module = types.ModuleType(name)
        module.__file__ = os.path.abspath(path)
        sys.modules[name] = module
        exec(compile(source, os.path.join(private, fresh("f_") + ".py"), "exec"), module.__dict__)
        return module, source

    def renamed(func):
        name = fresh("t_")
        try:
            code = func.__code__.replace(co_name=name, co_qualname=name)
        except TypeError:  # before Python 3.11: no co_qualname
            code = func.__code__.replace(co_name=name)
        copy = types.FunctionType(code, func.__globals__, name, func.__defaults__, func.__closure__)
        copy.__kwdefaults__, copy.__qualname__ = func.__kwdefaults__, name
        copy.__dict__.update(func.__dict__)
        return copy

    def runner_modules():
        return [k for k in sys.modules if k in ("pytest", "py", "pluggy") or k.startswith(("_pytest", "pytest.", "pluggy.", "xdist"))]

    def call(run):
        # no timer, no signal handler here (pytest's run has them: none may look alike); the
        # whole run's time limit is kept from outside, and a test it never reports failed
        hidden = {k: sys.modules.pop(k) for k in runner_modules()}  # a test's module may import pytest
        try:
            run()
            return "passed"
        except BaseException:
            traceback.print_exc(file=sys.stdout)
            return "failed"
        finally:
            sys.modules.update(hidden)

    def marks(obj):
        found = getattr(obj, "pytestmark", []) or []
        found = found if isinstance(found, list) else [found]
        blocking = {"usefixtures", "parametrize", "skip", "skipif", "xfail"}
        return [m for m in found if getattr(m, "name", "") in blocking]

    def xunit(obj, name, *args):
        # as pytest calls them: with the module, method or class when the hook takes it
        hook = getattr(obj, name, None)
        if hook is None:
            return
        code = getattr(getattr(hook, "__func__", hook), "__code__", None)
        wanted = len(args) if code is None else code.co_argcount - (1 if hasattr(hook, "__self__") else 0)
        hook(*args[: max(wanted, 0)])

    # plugins of the environment (never a workspace file) that set the process up before any test
    # module is imported (settings, environment variables): without them nothing runs as under pytest
    found = [importlib.util.find_spec(m) for m in SETTING_UP]
    setting_up = [f for f in found if f is not None and not os.path.realpath(f.origin or here).startswith(here + os.sep)]
    sys.path[:0] = ini_pythonpath()
    sys.path.append(here)  # as the guarded pytest run has it: the workspace, after what is installed
    send("start")
    if setting_up:
        for test_id in ids:
            send("notrun", "plugins", False, test_id)
        send("finish", "0")
        return 0
    modules, conftests = {}, {}
    for test_id in ids:
        path, _, rest = test_id.partition("::")
        parts = rest.split("::")
        if "[" in rest:
            send("notrun", "parametrized", False, test_id)
            continue
        folder, chain = os.path.dirname(os.path.abspath(path)), []
        while True:
            chain.insert(0, os.path.join(folder, "conftest.py"))
            if os.path.abspath(folder) == here or len(folder) <= len(here):
                break
            folder = os.path.dirname(folder)
        why = None
        for conftest in [c for c in chain if os.path.isfile(c)]:
            if conftest not in conftests:
                try:
                    conftests[conftest] = load(conftest)[1]
                except BaseException:
                    traceback.print_exc(file=sys.stdout)
                    conftests[conftest] = None
            if conftests[conftest] is None:
                why = "import"
            elif b"autouse" in conftests[conftest]:
                why = why or "autouse"
        if why is None and path not in modules:
            try:
                modules[path] = load(path)
            except BaseException:
                traceback.print_exc(file=sys.stdout)
                modules[path] = None
        if why is None and modules.get(path) is None:  # pytest imported it: a finding, not a gap
            send("call", "failed", False, test_id)
            continue
        if why is None and b"autouse" in modules[path][1]:
            why = "autouse"
        if why is not None:
            send("notrun", why, False, test_id)
            continue
        module = modules[path][0]
        owner, obj = None, module
        for part in parts:
            owner, obj = obj, getattr(obj, part, None)
            if obj is None:
                break
        if obj is None or not callable(obj):
            send("notrun", "notfound", False, test_id)
            continue
        flags = getattr(getattr(getattr(obj, "__func__", obj), "__code__", None), "co_flags", 0)
        if flags & (0x80 | 0x200):  # CO_COROUTINE, CO_ASYNC_GENERATOR
            send("notrun", "async", False, test_id)
            continue
        if marks(obj) or (owner is not module and marks(owner)) or marks(module):
            send("notrun", "marked", False, test_id)
            continue
        unittest = sys.modules.get("unittest")  # a TestCase needs its module to have imported it
        if unittest is not None and isinstance(owner, type) and issubclass(owner, unittest.TestCase):
            method = fresh("test_")
            setattr(owner, method, renamed(obj))
            result = unittest.TestResult()
            hidden = {k: sys.modules.pop(k) for k in runner_modules()}
            try:
                unittest.TestSuite([owner(method)]).run(result)
            finally:
                sys.modules.update(hidden)
            for _, text in result.errors + result.failures:
                print(text)
            if result.skipped or result.expectedFailures:
                send("notrun", "marked", False, test_id)
            else:
                send("call", "passed" if result.wasSuccessful() else "failed", False, test_id)
            continue
        if owner is not module and not isinstance(owner, type):
            send("notrun", "unsupported", False, test_id)
            continue
        function = getattr(obj, "__func__", obj)
        if not isinstance(function, types.FunctionType):
            send("notrun", "unsupported", False, test_id)
            continue
        code = function.__code__
        positional = code.co_varnames[: code.co_argcount]
        params = list(positional[: len(positional) - len(function.__defaults__ or ())])
        params += [n for n in code.co_varnames[code.co_argcount : code.co_argcount + code.co_kwonlyargcount]
                   if n not in (function.__kwdefaults__ or {})]
        if owner is not module:
            params = params[1:]
        if any(p != "tmp_path" for p in params):
            send("notrun", "fixtures", False, test_id)
            continue
        test = renamed(function)

        def run(test=test, owner=owner, params=params):
            if params:
                import pathlib, tempfile
            kwargs = {"tmp_path": pathlib.Path(tempfile.mkdtemp(prefix=fresh("p_")))} if params else {}
            xunit(module, "setup_module", module)
            try:
                if owner is module:
                    xunit(module, "setup_function", test)
                    try:
                        test(**kwargs)
                    finally:
                        xunit(module, "teardown_function", test)
                else:
                    xunit(owner, "setup_class", owner)
                    instance = owner()
                    try:
                        xunit(instance, "setup_method", test)
                        try:
                            test(instance, **kwargs)
                        finally:
                            xunit(instance, "teardown_method", test)
                    finally:
                        xunit(owner, "teardown_class", owner)
            finally:
                xunit(module, "teardown_module", module)

        send("call", call(run), False, test_id)
    send("finish", "0")


import sys
sys.exit(_independent())
"""
)


#: The Python to run with: the first that finds pytest without importing it or any workspace module
#: (as :data:`~.guarded.FIND_PYTHON_GUARDED` picks, at a tenth of its cost).
FIND_PYTHON = (
    'for __py in python3 python; do if command -v "$__py" >/dev/null 2>&1 && "$__py" -c '
    "\"import sys, importlib.util; sys.path.pop(0); sys.exit(importlib.util.find_spec('pytest') is None)\" "
    ">/dev/null 2>&1; then break; fi; __py=; done"
)


@dataclass
class IndependentRun:
    """The independent run's results: ``outcomes`` (test id -> passed | failed), ``not_run``
    (test id -> why), ``problems`` (why the channel cannot be trusted), and its console output."""

    outcomes: dict[str, str] = field(default_factory=dict)
    not_run: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    output: str = ""
    timed_out: bool = False
    asked: list[str] = field(default_factory=list)  # the ids it was given (:func:`runnable` ones)

    def disagrees(self, held_out: dict[str, str]) -> list[str]:
        """The tests the held-out run saw pass that this run was asked about and saw fail (or never
        reported: the process ended early)."""
        asked = set(self.asked)
        return sorted(
            t
            for t, o in held_out.items()
            if o == "passed"
            and t in asked
            and t not in self.not_run
            and self.outcomes.get(t, "failed") != "passed"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "outcomes": self.outcomes,
            "not_run": self.not_run,
            "problems": self.problems,
            "timed_out": self.timed_out,
            # what the runner printed (tracebacks of what failed), to tell a false alarm from a cheat
            "output_tail": self.output[-2000:],
            "asked": len(self.asked),
        }


def runnable(test_ids: list[str]) -> list[str]:
    """The ids this runner can be asked about: pytest node ids of a ``.py`` file, no white space."""
    return [
        t
        for t in test_ids
        if "::" in t and t.split("::")[0].endswith(".py") and not any(c.isspace() for c in t)
    ]


async def run_independently(sandbox: Sandbox, test_ids: list[str], *, test_timeout: float) -> IndependentRun:
    """Run ``test_ids`` (:func:`runnable` ones) in a fresh process in ``sandbox``'s workspace, in at
    most ``test_timeout`` seconds a test, kept from outside (a test not reported by then failed)."""
    ids = runnable(test_ids)
    result = IndependentRun(asked=ids)
    if not ids:
        return result
    async with private_temp_dir(sandbox) as folder:
        key = guard.new_key()
        key_file = f"{folder}/{secrets.token_hex(8)}"
        await sandbox.write_file(key_file, key.encode("ascii"))
        command = (
            f"{FIND_PYTHON}; "
            '[ -n "$__py" ] || { echo "no Python with pytest in the sandbox"; exit 127; }; '
            '"$__py" -c ' + shlex.join([RUNNER, folder, key_file, "--", *ids])
        )
        run = await sandbox.exec(
            command,
            timeout=min(600.0, 60.0 + test_timeout * len(ids)),
            cwd=WORKSPACE,
            env={"PYTHONDONTWRITEBYTECODE": "1"},
        )
    stream = guard.read_stream(run.output, key)
    result.output, result.timed_out = guard.without_stream(run.output), run.timed_out
    result.problems = list(stream.problems)
    if not stream.finished and not run.timed_out:
        result.problems.append(
            "the independent run ended before it finished (the process was ended from inside)"
        )
    for test_id, phases in stream.phases.items():
        if "notrun" in phases:
            result.not_run[test_id] = NOT_RUN.get(phases["notrun"][0], "not run")
        elif "call" in phases and "conflict" not in phases:
            result.outcomes[test_id] = phases["call"][0]
        else:
            result.outcomes[test_id] = "failed"
    return result
