"""What a Python project's environment needs, found from its files: :func:`discover`.

From the files the sandbox copy holds: the project itself (installed editable), its test extras
and the extras its tests import (:mod:`.extras`), dependency groups and requirement files, the
pytest plugins its configuration asks for, and pytest; the list, in order, is in
environments/README.md. Everything goes into one pip run, so the resolver
sees all constraints at once. The repository's ``.clover/config.toml`` can replace each finding
(:class:`EnvironmentOptions`).
"""

from __future__ import annotations

import ast
import configparser
import hashlib
import os
import posixpath
import re
import shlex
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from clover_agent.environments import extras as extras_module
from clover_agent.environments.files import listed_files
from clover_agent.environments.recipe import (
    DEFAULT_INSTALLER,
    SETUP_DIR,
    VENV,
    EnvironmentRecipe,
    PackageIndex,
    SetupStep,
)
from clover_agent.sandboxes.errors import SandboxSetupError

TEST_NAMES = ("test", "tests", "testing")
#: After the install: the project's installed metadata says the version its build was told to
#: pretend (a build tool that did not read it says 0.1.devN, and the mismatch is named).
_VERSION_CHECK = """
import importlib.metadata, sys
name, wanted = sys.argv[1], sys.argv[2]
found = importlib.metadata.version(name)
if found != wanted:
    sys.exit(f"the installed {name} says version {found}, not {wanted}: its build did not read the pretend "
             "version; set SETUPTOOLS_SCM_PRETEND_VERSION in .clover/config.toml's setup commands, or tag the commit")
print(f"{name} {found}")
"""
DEV_NAMES = ("dev", "develop", "development")
_REQUIREMENTS = re.compile(
    r"^(?:(?:requirements|reqs)(?:[-_.](?:test|tests|testing|dev|develop|ci))?"
    r"|(?:test|tests|testing|dev|develop|ci)[-_.]requirements|(?:test|tests|testing)"
    r"|tests?/requirements)\.txt$"
)
_REQUIREMENTS_DIR = re.compile(r"^(?:requirements|reqs)/(?:test|tests|testing|dev|develop|ci)[^/]*\.txt$")
#: Build tools that take the version from git tags (setuptools-scm; hatch-vcs uses it too).
_SCM_TOOLS = ("setuptools-scm", "hatch-vcs", "setuptools-git-versioning")
#: A version setuptools-scm can be told to pretend (what a tag or PKG-INFO says, checked).
_VERSION = re.compile(r"^v?(\d+(?:\.\d+)*(?:[-_.+]?[A-Za-z0-9]+)*)$")
#: pytest options and ini keys that need a plugin, and the plugin.
_PLUGIN_OPTIONS = (
    ("--cov", "pytest-cov"),
    ("--no-cov", "pytest-cov"),
    ("-n", "pytest-xdist"),
    ("--numprocesses", "pytest-xdist"),
    ("--dist", "pytest-xdist"),
    ("--benchmark", "pytest-benchmark"),
    ("--timeout", "pytest-timeout"),
    ("--reruns", "pytest-rerunfailures"),
    ("--randomly", "pytest-randomly"),
    ("--hypothesis", "hypothesis"),
    ("--forked", "pytest-forked"),
    ("--mypy", "pytest-mypy"),
    ("--mpl", "pytest-mpl"),
)
_PLUGIN_INI_KEYS = {
    "asyncio_mode": "pytest-asyncio",
    "asyncio_default_fixture_loop_scope": "pytest-asyncio",
    "timeout": "pytest-timeout",
    "env": "pytest-env",
    "DJANGO_SETTINGS_MODULE": "pytest-django",
    "mock_use_standalone_module": "pytest-mock",
}
#: Finds the editable distribution installed from /workspace and prints its extras that match
#: the test (else dev) names, comma-separated (the metadata is only known once it is built).
_EXTRAS_PROBE = f"""
import importlib.metadata as m, json
for d in m.distributions():
    url = json.loads(d.read_text("direct_url.json") or "{{}}").get("url", "")
    if url.rstrip("/") == "file:///workspace":
        extras = d.metadata.get_all("Provides-Extra") or []
        test = [e for e in extras if e in {TEST_NAMES!r}]
        print(",".join(test or [e for e in extras if e in {DEV_NAMES!r}]))
        break
"""


@dataclass(frozen=True)
class EnvironmentOptions:
    """The repository's and the user's choices; None means "find it from the files"."""

    enabled: bool = True  # false: no environment, the image's own Python as it is
    install_project: bool | None = None  # None: when the project is installable
    extras: tuple[str, ...] | None = None
    groups: tuple[str, ...] | None = None
    requirements: tuple[str, ...] | None = None
    packages: tuple[str, ...] = ()  # more requirement strings
    setup: tuple[str, ...] = ()  # commands run after the install, in the environment
    wheels: str | None = None  # host folder of wheels / sdists (``pip download``)
    network: bool = True  # false: install from ``wheels`` alone, no network at all
    index: PackageIndex = field(default_factory=PackageIndex)
    timeout: float = 1800.0
    installer: str = DEFAULT_INSTALLER  # "uv" (pip the fallback) or "pip"


def discover(repo: str | os.PathLike[str], options: EnvironmentOptions) -> EnvironmentRecipe | None:
    """The environment recipe for the Python project in ``repo``, or None when it needs none (not
    a Python project, or ``options.enabled`` is false). A wheel folder that is not there, or
    offline set-up without one, is a :class:`SandboxSetupError`."""
    if not options.enabled:
        return None
    root = Path(repo)
    files = _workspace_files(root)
    if not any(f.endswith(".py") or f.endswith(".toml") or f.endswith(".txt") for f in files):
        return None
    found = _Findings(root, files)
    found.scan(options)
    if not found.is_python:
        return None
    return found.recipe(options)


class _Findings:
    def __init__(self, root: Path, files: set[str]) -> None:
        self.root = root
        self.files = files
        self.key_files: dict[str, str] = {}
        self.lines: list[str] = []
        self.installable = False
        self.dynamic_extras = False
        self.extras: list[str] = []
        #: The declared extras not installed, each with its distributions (for the diagnosis).
        self.other_extras: dict[str, list[str]] = {}
        self.requirements: list[str] = []  # requirement strings
        self.requirement_files: list[str] = []
        #: A chosen requirement file that also names the project itself (``-e .``), as given to pip
        #: instead: without those lines (they would install it a second time, which pip refuses).
        self.without_project: dict[str, str] = {}
        self.constraint_files: list[str] = []
        self.variables: dict[str, str] = {}
        self.pretended: tuple[str, str] | None = None  # (distribution, version) the build is told
        self.pytest_ini: list[tuple[str, dict[str, str]]] = []  # (file, ini options)
        self.is_python = False

    # --- reading -----------------------------------------------------------------------------
    def _text(self, rel: str) -> str | None:
        if rel not in self.files:
            return None
        try:
            data = (self.root / rel).read_bytes()
        except OSError:
            return None
        self.key_files[rel] = hashlib.sha256(data).hexdigest()
        return data.decode("utf-8", "replace")

    def _toml(self, rel: str) -> dict:
        text = self._text(rel)
        if text is None:
            return {}
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise SandboxSetupError(
                f"{self.root / rel} is not valid TOML ({exc}); fix it or set the "
                "environment up yourself in .clover/config.toml"
            ) from None

    def _ini(self, rel: str) -> configparser.ConfigParser:
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        text = self._text(rel)
        if text is not None:
            try:
                parser.read_string(text)
            except configparser.Error:
                self.lines.append(f"{rel}: not readable as an ini file, ignored")
        return parser

    # --- what the files say ------------------------------------------------------------------
    def scan(self, options: EnvironmentOptions) -> None:
        pyproject = self._toml("pyproject.toml")
        setup_cfg = self._ini("setup.cfg")
        tox = self._ini("tox.ini")
        has_setup_py = self._text("setup.py") is not None
        project = found if isinstance(found := pyproject.get("project"), dict) else {}
        self.installable = bool(project or "build-system" in pyproject or has_setup_py) or (
            setup_cfg.has_section("metadata") and setup_cfg.has_option("metadata", "name")
        )
        self.is_python = self.installable or any(f.endswith(".py") for f in self.files)
        if options.install_project is not None:
            self.installable = options.install_project and self.installable

        self._scm_version(pyproject, project, setup_cfg)
        declared = _extras_of(project, setup_cfg)
        self.dynamic_extras = self.installable and (
            "optional-dependencies" in project.get("dynamic", [])
            or (not project and has_setup_py and not declared)
        )
        if options.extras is not None:
            self.extras, self.dynamic_extras = list(options.extras), False
        else:
            self.extras = _pick(declared)

        groups = pyproject.get("dependency-groups", {})
        chosen_groups = list(options.groups) if options.groups is not None else _pick(list(groups))
        for name in chosen_groups:
            self.requirements += _group_requirements(groups, name, self.root / "pyproject.toml")

        if options.requirements is not None:
            self.requirement_files = list(options.requirements)
            missing = [r for r in self.requirement_files if r not in self.files]
            if missing:
                raise SandboxSetupError(
                    f"the requirement files {', '.join(missing)} named in .clover/config.toml are not "
                    f"in {self.root} (or are ignored by git)"
                )
        else:
            self.requirement_files = _choose_requirement_files(
                sorted(f for f in self.files if _REQUIREMENTS.match(f) or _REQUIREMENTS_DIR.match(f))
            )

        # What names the test dependencies, else what the project's test runner installs.
        names_tests = bool(
            any(_normalize(n) in TEST_NAMES for n in [*self.extras, *chosen_groups])
            or any(_kind(f) == "test" for f in self.requirement_files)
        )
        if not names_tests and options.requirements is None:
            tests_require = _lines(setup_cfg.get("options", "tests_require", fallback=""))
            testenv = None if tests_require else self._tox_testenv(tox, setup_cfg, pyproject)
            if tests_require:
                self.requirements += tests_require
                self.lines.append("setup.cfg's tests_require")
            elif testenv is not None:
                self._use_tox(testenv, declared, keep_extras=options.extras is not None)
        if self.installable:
            self._project_in_requirement_files()
            self._extras_the_tests_import(project, setup_cfg, options.packages, add=options.extras is None)
        if self.extras and self.installable:
            named = [
                e for e in self.extras if not any(line.startswith(f"its extra {e}:") for line in self.lines)
            ]
            if named:
                self.lines.insert(0, f"its extras {', '.join(named)}")
        if chosen_groups:
            self.lines.append(f"its dependency groups {', '.join(chosen_groups)}")
        for rel in [*self.requirement_files, *self.constraint_files]:
            self._hash_with_includes(rel, set())
        if self.requirement_files:
            self.lines.append(f"its requirement files {', '.join(self.requirement_files)}")

        tool = pyproject.get("tool", {})
        pytest_table = tool.get("pytest", {}) if isinstance(tool, dict) else {}
        if isinstance(pytest_table, dict):
            options_table = pytest_table.get("ini_options", pytest_table)
            self.pytest_ini.append(("pyproject.toml", _stringify(options_table)))
        for rel, section in (("pytest.ini", "pytest"), ("setup.cfg", "tool:pytest"), ("tox.ini", "pytest")):
            parser = setup_cfg if rel == "setup.cfg" else tox if rel == "tox.ini" else self._ini(rel)
            if parser.has_section(section):
                self.pytest_ini.append((rel, dict(parser.items(section))))
        self.requirements += options.packages

    def _scm_version(self, pyproject: dict, project: dict, setup_cfg: configparser.ConfigParser) -> None:
        """A project whose version comes from git tags (setuptools-scm, hatch-vcs) is told its
        version when the repository cannot say it (no tag: a fresh clone, a fork, an sdist made a
        repository, where the tool says 0.1.devN): the last tag's, else PKG-INFO's."""
        if not self.installable or (project and "version" not in project.get("dynamic", [])):
            return
        build = pyproject.get("build-system", {})
        requires = build.get("requires", []) if isinstance(build, dict) else []
        tool = pyproject.get("tool", {}) if isinstance(pyproject.get("tool"), dict) else {}
        hatch_version = (
            tool.get("hatch", {}).get("version", {}) if isinstance(tool.get("hatch"), dict) else {}
        )
        setup_text = " ".join(
            t for t in (self._text("setup.py"), setup_cfg.get("options", "setup_requires", fallback="")) if t
        )
        uses_scm = (
            any(
                _normalize(re.split(r"[^\w.-]", r, maxsplit=1)[0]) in _SCM_TOOLS
                for r in requires
                if isinstance(r, str)
            )
            or "setuptools_scm" in tool
            or (isinstance(hatch_version, dict) and hatch_version.get("source") == "vcs")
            or "use_scm_version" in setup_text
            or "setuptools_scm" in setup_text
        )
        if not uses_scm:
            return
        pkg_info = self._text("PKG-INFO")
        name = project.get("name") or setup_cfg.get("metadata", "name", fallback=None)
        if not name and pkg_info:
            name = _header(pkg_info, "Name")
        tag = _last_tag(self.root)
        version, source = None, ""
        if tag and (match := _VERSION.match(tag)):
            version, source = match[1], f"the last tag, {tag}"
        elif pkg_info and (found := _header(pkg_info, "Version")) and _VERSION.match(found):
            version, source = found, "PKG-INFO"
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9._-]+", name) or version is None:
            self.lines.append(
                "a version from git tags, but no tag and no PKG-INFO to take it from: the build tool "
                "will say 0.1.devN (set SETUPTOOLS_SCM_PRETEND_VERSION in .clover/config.toml's setup "
                "commands, or tag the commit)"
            )
            return
        variable = "SETUPTOOLS_SCM_PRETEND_VERSION_FOR_" + _normalize(name).replace("-", "_").upper()
        # Both: setuptools-scm before 6.1, and a setup.py's use_scm_version (no distribution name
        # reaches it), read only the plain one; hatch-vcs and pyproject builds read either.
        self.variables[variable] = version
        self.variables["SETUPTOOLS_SCM_PRETEND_VERSION"] = version
        self.pretended = (name, version)
        self.lines.append(
            f"its version {version}, from {source} ({variable} and SETUPTOOLS_SCM_PRETEND_VERSION; "
            "checked after the install)"
        )

    def _tox_testenv(
        self, tox: configparser.ConfigParser, setup_cfg: configparser.ConfigParser, pyproject: dict
    ) -> _ToxEnv | None:
        """tox's base test environment (``[testenv]``) from tox.ini, setup.cfg or pyproject.toml."""
        if tox.has_section("testenv"):
            return _ToxEnv.of_ini("tox.ini's [testenv]", tox)
        if setup_cfg.has_section("tox:tox") and setup_cfg.has_section("testenv"):
            return _ToxEnv.of_ini("setup.cfg's [testenv]", setup_cfg)
        table = pyproject.get("tool", {}).get("tox") if isinstance(pyproject.get("tool"), dict) else None
        if not isinstance(table, dict):
            return None
        if isinstance(table.get("legacy_tox_ini"), str):
            parser = configparser.ConfigParser(interpolation=None, strict=False)
            try:
                parser.read_string(table["legacy_tox_ini"])
            except configparser.Error:
                return None
            return (
                _ToxEnv.of_ini("pyproject.toml's legacy_tox_ini", parser)
                if parser.has_section("testenv")
                else None
            )
        base = table.get("env_run_base")
        if not isinstance(base, dict):
            return None
        deps = [d for d in base.get("deps", []) if isinstance(d, str)]
        extras = [e for e in base.get("extras", []) if isinstance(e, str)]
        return _ToxEnv("pyproject.toml's [tool.tox.env_run_base]", deps, extras if "extras" in base else None)

    def _use_tox(self, env: _ToxEnv, declared: list[str], *, keep_extras: bool) -> None:
        """Install what tox's plain test environment installs: its deps (those of no factor, as in
        ``tox -e py``), its requirement and constraint files, and its extras (unless
        ``keep_extras``: the repository's file chose them)."""
        left_out: list[str] = []
        for line in env.deps:
            line = line.replace("{toxinidir}/", "").replace("{toxinidir}", ".")
            condition = re.match(r"^([\w{}.!,-]+):\s+(.+)$", line)
            if condition:
                if not _holds_without_factors(condition[1]):
                    left_out.append(condition[1])
                    continue
                line = condition[2].strip()
            if "{" in line:
                continue  # another substitution: nothing to install that can be known here
            option = re.match(r"^(-r|-c|--requirement|--constraint)\s*=?\s*(\S+)$", line)
            if option:
                rel = os.path.normpath(option[2]).replace(os.sep, "/")
                target = (
                    self.requirement_files if option[1] in ("-r", "--requirement") else self.constraint_files
                )
                if rel in self.files and rel not in target:
                    target.append(rel)
                continue
            if line.startswith("-"):
                continue  # -e . (the project is installed anyway), pip options
            self.requirements.append(line)
        # the dev requirement files are what a developer installs; tox is what the tests run with
        self.requirement_files = [
            f for f in self.requirement_files if _kind(f) != "dev" or f in env.deps_files(self.files)
        ]
        if env.extras is not None and not keep_extras:
            self.extras = [
                e
                for e in env.extras
                if (e in declared or self.dynamic_extras) and extras_module.EXTRA_NAME.match(e)
            ]  # ``{env:X:}`` and other substitutions are not names
            self.dynamic_extras = False
        note = (
            f" (the plain environment: lines for {', '.join(dict.fromkeys(left_out))} left out)"
            if left_out
            else ""
        )
        self.lines.append(f"{env.where} deps{note}")

    def _extras_the_tests_import(
        self, project: dict, setup_cfg: configparser.ConfigParser, packages: tuple[str, ...], *, add: bool
    ) -> None:
        """With ``add``, add the declared extras that provide a module collecting the tests
        imports (unguarded) and nothing else installed provides: ``yaml`` for ``import yaml`` when
        the extra ``yaml`` lists PyYAML. The extras left are kept, with their distributions, for
        the diagnosis."""
        declared = _declared_requirements(project, setup_cfg) or _setup_py_extras(self._text("setup.py"))
        name = project.get("name") or setup_cfg.get("metadata", "name", fallback=None)
        name = name if isinstance(name, str) else None
        dists = {
            extra: extras_module.distributions(reqs, name, declared)
            for extra, reqs in declared.items()
            if extras_module.EXTRA_NAME.match(extra)
        }
        chosen = {_normalize(e) for e in self.extras}
        others = {e: d for e, d in dists.items() if _normalize(e) not in chosen}
        if not others or not add:
            self.other_extras = others
            return
        dependencies = project.get("dependencies")
        base = [*(dependencies if isinstance(dependencies, list) else [])]
        base += _lines(setup_cfg.get("options", "install_requires", fallback=""))
        installed = extras_module.distributions(
            [*(r for r in base if isinstance(r, str)), *self.requirements, *packages, "pytest"],
            name,
            declared,
        )
        for e in self.extras:
            installed += dists.get(e, [])
        for rel in self.requirement_files:
            installed += _requirement_file_names(self._text(rel) or "")
        own = _own_names(self.files)
        added: dict[str, tuple[str, str]] = {}  # extra → (module, distribution)
        for module, _where in extras_module.collected_imports(self.root, self.files, own).items():
            if any(extras_module.provides(d, module, loose=False) for d in installed):
                continue
            if any(extras_module.provides(d, module, loose=False) for e in added for d in others[e]):
                continue
            found = extras_module.extra_for(module, others)
            if found is not None and found[0] not in added:
                added[found[0]] = (module, found[1])
        for extra, (module, dist) in added.items():
            self.extras.append(extra)
            self.lines.append(f"its extra {extra}: the tests import {module} ({dist})")
        self.other_extras = {e: d for e, d in others.items() if e not in added}

    def _project_in_requirement_files(self) -> None:
        """A requirement file's lines that name the project itself (``.``, ``-e .[test]``): the
        set-up installs it editable already, and pip refuses it twice, once not editable. Their
        extras join the editable install's; the file goes to pip without them (its includes made
        absolute), or not at all when nothing else is left in it."""
        for rel in list(self.requirement_files):
            text = self._text(rel)
            if text is None:
                continue
            own = [m for m in map(_PROJECT_ITSELF.match, text.splitlines()) if m]
            if not own:
                continue
            for match in own:
                for extra in (e.strip() for e in (match[1] or "").split(",")):
                    if extra and extras_module.EXTRA_NAME.match(extra) and extra not in self.extras:
                        self.extras.append(extra)
            rest = [
                _absolute_include(line, rel) for line in text.splitlines() if not _PROJECT_ITSELF.match(line)
            ]
            said = ", ".join(f"`{m[0].strip()}`" for m in own)
            if any(line.strip() and not line.lstrip().startswith("#") for line in rest):
                self.without_project[rel] = "\n".join(rest) + "\n"
                self.lines.append(
                    f"{rel} names the project itself ({said}): installed editable, that line left out"
                )
            else:
                self.requirement_files.remove(rel)
                self.lines.append(f"{rel} names only the project itself ({said}): installed editable")

    def _hash_with_includes(self, rel: str, seen: set[str]) -> None:
        """Hash ``rel`` and the files it names with ``-r`` / ``-c`` (pip reads them too)."""
        if rel in seen:
            return
        seen.add(rel)
        text = self._text(rel)
        if text is None:
            return
        for line in text.splitlines():
            match = re.match(r"^\s*(?:-r|-c|--requirement|--constraint)[\s=]*(\S+)", line)
            if match:
                included = os.path.normpath(os.path.join(os.path.dirname(rel), match[1]))
                self._hash_with_includes(included.replace(os.sep, "/"), seen)

    def plugins(self) -> list[str]:
        """pytest plugins the configuration needs, in the order first asked for."""
        needed: list[str] = []
        for _, ini in self.pytest_ini:
            for spec in _lines(ini.get("required_plugins", "")):
                needed.append(spec)
            words = shlex.split(ini.get("addopts", ""), posix=True) if ini.get("addopts") else []
            for word in words:
                for option, plugin in _PLUGIN_OPTIONS:
                    if (
                        word == option
                        or word.startswith(option + "=")
                        or (option.startswith("--") and word.startswith(option + "-"))
                    ):
                        needed.append(plugin)
            needed += [plugin for key, plugin in _PLUGIN_INI_KEYS.items() if key in ini]
            minversion = ini.get("minversion")
            if minversion and re.fullmatch(r"[\d.]+", minversion.strip()):
                needed.append(f"pytest>={minversion.strip()}")
        return list(dict.fromkeys(needed))

    # --- the recipe --------------------------------------------------------------------------
    def recipe(self, options: EnvironmentOptions) -> EnvironmentRecipe:
        wheel_files = _wheel_files(options)
        plugins = self.plugins()
        if plugins:
            self.lines.append(f"what its pytest configuration needs: {', '.join(plugins)}")
        args: list[str] = []
        what: list[str] = []
        if self.installable:
            args += ["-e", "." + (f"[{','.join(_spellings(self.extras))}]" if self.extras else "")]
            what.append(
                "the project (editable" + (f", extras {', '.join(self.extras)})" if self.extras else ")")
            )
            self.lines.insert(0, "the project, installed editable")
        generated: list[tuple[str, str]] = []
        for rel in self.requirement_files:
            if rel in self.without_project:
                name = f"requirements-{len(generated) + 1}.txt"
                generated.append((name, self.without_project[rel]))
                args += ["-r", f"{SETUP_DIR}/{name}"]
            else:
                args += ["-r", rel]
        for rel in self.constraint_files:
            args += ["-c", rel]
        what += [
            f"{rel} (without the project's own line)" if rel in self.without_project else rel
            for rel in self.requirement_files
        ]
        extra = list(dict.fromkeys([*self.requirements, *plugins, "pytest"]))
        args += extra
        what += extra  # every package, as pip is given it
        self.lines.append("pytest: the version its dependencies ask for, else the current release")
        install = _Installer(options.installer, offline=not options.network)
        steps = [install.step(", ".join(what), shlex.join(args))]
        if self.dynamic_extras:
            steps.append(
                install.step(
                    "the project's test extras (read from its built metadata)",
                    '-e ".[$extras]"',
                    before=f"extras=$(python -c {shlex.quote(_EXTRAS_PROBE)}) && "
                    f'if [ -n "$extras" ]; then echo "extras: $extras"; ',
                    after="; fi",
                )
            )
        if self.pretended is not None and self.installable:
            name, version = self.pretended
            steps.append(
                SetupStep(
                    f"check that the installed {name} says version {version}",
                    f"python -c {shlex.quote(_VERSION_CHECK)} {shlex.quote(name)} {shlex.quote(version)}",
                )
            )
        steps += [SetupStep(f"run {command}", command) for command in options.setup]
        if options.wheels:
            self.lines.append(
                f"packages from the wheel folder {options.wheels} ({len(wheel_files)} files)"
                + (", no network" if not options.network else "")
            )
        return EnvironmentRecipe(
            steps=tuple(steps),
            found=tuple(self.lines),
            key_files=tuple(sorted(self.key_files.items())),
            index=options.index,
            wheels=options.wheels,
            wheel_files=wheel_files,
            network=options.network,
            timeout=options.timeout,
            variables=tuple(sorted(self.variables.items())),
            files=tuple(generated),
            extras=tuple(self.extras) if self.installable else (),
            other_extras=tuple((e, tuple(d)) for e, d in self.other_extras.items())
            if self.installable
            else (),
            installer=options.installer,
        )


@dataclass(frozen=True)
class _Installer:
    """The install steps' commands: ``python -m pip install ...``, or uv's pip interface into the
    environment (``uv pip install --python VENV/bin/python ...``, ``--no-index`` offline) with the
    pip form kept beside it (:attr:`SetupStep.with_pip`)."""

    name: str
    offline: bool

    def step(self, what: str, args: str, *, before: str = "", after: str = "") -> SetupStep:
        pip = SetupStep(f"pip install {what}", f"{before}python -m pip install {args}{after}")
        if self.name == "pip":
            return pip
        uv = f"uv pip install --python {VENV}/bin/python" + (" --no-index" if self.offline else "")
        return SetupStep(f"uv pip install {what}", f"{before}{uv} {args}{after}", with_pip=pip)


def _workspace_files(root: Path) -> set[str]:
    listed = listed_files(root)
    if listed is not None:
        return set(listed)
    return {
        p.relative_to(root).as_posix()
        for pattern in ("*", "requirements/*")
        for p in root.glob(pattern)
        if p.is_file()
    }


def _declared_requirements(project: dict, setup_cfg: configparser.ConfigParser) -> dict[str, list[str]]:
    """Each declared extra's requirement strings (pyproject's, then setup.cfg's)."""
    table = project.get("optional-dependencies", {})
    out = {
        name: [r for r in reqs if isinstance(r, str)]
        for name, reqs in (table.items() if isinstance(table, dict) else [])
        if isinstance(reqs, list)
    }
    if setup_cfg.has_section("options.extras_require"):
        for name, value in setup_cfg.items("options.extras_require"):
            out.setdefault(name, [r for line in _lines(value) for r in line.split(";")[:1] if r.strip()])
    return out


def _setup_py_extras(text: str | None) -> dict[str, list[str]]:
    """``extras_require`` of a ``setup.py`` where it is a literal: in the ``setup()`` call, or a
    module-level name bound to one (read with :mod:`ast`, never run)."""
    if not text or len(text) > 1_000_000:
        return {}
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    bound = {
        target.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg == "extras_require":
                    value = keyword.value
                    if isinstance(value, ast.Name):
                        value = bound.get(value.id, value)
                    try:
                        found = ast.literal_eval(value)
                    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                        return {}
                    if isinstance(found, dict):
                        return {
                            k: [r for r in ([v] if isinstance(v, str) else v) if isinstance(r, str)]
                            for k, v in found.items()
                            if isinstance(k, str) and isinstance(v, str | list | tuple)
                        }
    return {}


def _requirement_file_names(text: str) -> list[str]:
    return [
        found[0]
        for line in text.splitlines()
        if not line.lstrip().startswith(("-", "#")) and (found := extras_module.requirement_name(line))
    ]


def _own_names(files: set[str]) -> set[str]:
    """The top-level module names the project's files make (flat, ``src/`` or ``lib/`` layout)."""
    names = set()
    for rel in files:
        parts = rel.split("/")
        if parts[0] in ("src", "lib") and len(parts) > 1:
            parts = parts[1:]
        if len(parts) > 1 or parts[0].endswith(".py"):
            names.add(parts[0].removesuffix(".py"))
    return {n for n in names if n.isidentifier()}


def _extras_of(project: dict, setup_cfg: configparser.ConfigParser) -> list[str]:
    extras = project.get("optional-dependencies", {})
    names = list(extras) if isinstance(extras, dict) else []
    if setup_cfg.has_section("options.extras_require"):
        names += [n for n in setup_cfg.options("options.extras_require") if n not in names]
    return names


@dataclass(frozen=True)
class _ToxEnv:
    where: str  # the file (and table) it was read from
    deps: list[str]
    extras: list[str] | None  # None: not set

    @staticmethod
    def of_ini(where: str, parser: configparser.ConfigParser) -> _ToxEnv:
        extras = parser.get("testenv", "extras", fallback=None)
        return _ToxEnv(
            where,
            _lines(parser.get("testenv", "deps", fallback="")),
            None if extras is None else [e.strip() for e in re.split(r"[\s,]+", extras) if e.strip()],
        )

    def deps_files(self, files: set[str]) -> set[str]:
        return {f for f in files if any(f in d for d in self.deps)}


def _holds_without_factors(condition: str) -> bool:
    """Whether a tox factor condition (``a,b`` either, ``a-b`` both, ``!a`` not) holds for the
    environment of no factors; generative ``{...}`` conditions name factors, so they do not."""
    if "{" in condition:
        return False
    return any(
        all(factor.startswith("!") for factor in alternative.split("-") if factor)
        for alternative in condition.split(",")
        if alternative
    )


def _kind(rel: str) -> str:
    """A requirement file's kind: ``test``, ``dev`` (dev, develop, ci) or ``base``."""
    name = rel.rsplit("/", 1)[-1] if not rel.startswith("test") else rel
    if re.search(r"test", name):
        return "test"
    return "dev" if re.search(r"dev|ci", name) else "base"


#: A requirement line that names the project itself, by its folder (pip resolves it from the
#: working folder, the repository's top): ``.``, ``./``, ``-e .``, ``file:.``, with extras or not.
_PROJECT_ITSELF = re.compile(
    r"^\s*(?:(?:-e|--editable)(?:\s+|\s*=\s*))?(?:file:)?\.(?:/)?(?:\s*\[([^\]]*)\])?\s*(?:#.*)?$"
)
_INCLUDE = re.compile(r"^(\s*(?:-r|-c|--requirement|--constraint)(?:\s+|\s*=\s*))(\S+)(.*)$")


def _absolute_include(line: str, rel: str) -> str:
    """``line`` of the requirement file ``rel``, a ``-r``/``-c`` include made absolute in the
    sandbox's workspace (pip reads an include from the including file's folder; the copy is not
    there)."""
    match = _INCLUDE.match(line)
    if not match or match[2].startswith("/") or "://" in match[2]:
        return line
    path = posixpath.normpath(posixpath.join("/workspace", posixpath.dirname(rel), match[2]))
    return f"{match[1]}{path}{match[3]}"


def _choose_requirement_files(found: list[str]) -> list[str]:
    """The base requirement files and the test ones, else the dev ones (a dev file often pins
    the project itself or its whole tool chain)."""
    test = [f for f in found if _kind(f) == "test"]
    return [f for f in found if _kind(f) == "base"] + (test or [f for f in found if _kind(f) == "dev"])


def _spellings(extras: list[str]) -> list[str]:
    """The extras for pip, each also in its PEP 685 form where that differs (``python_ulid``,
    ``python-ulid``): metadata may spell it either way, and pip before 23.3 (the sandbox's venv
    has 23.0) compares them as written; the spelling a project lacks only gets a warning."""
    out: list[str] = []
    for extra in extras:
        out.append(extra)
        if _normalize(extra) != extra.lower():
            out.append(_normalize(extra))
    return list(dict.fromkeys(out))


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _header(pkg_info: str, name: str) -> str | None:
    """A header of a PKG-INFO file (the headers end at the first empty line)."""
    for line in pkg_info.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() == name.lower():
            return value.strip()
    return None


def _last_tag(root: Path) -> str | None:
    """The nearest tag reachable from HEAD (the host's git, the repository's fsmonitor not run)."""
    try:
        out = subprocess.run(
            ["git", "-c", "core.fsmonitor=false", "-C", str(root), "describe", "--tags", "--abbrev=0"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _pick(names: list[str]) -> list[str]:
    """The test names present, else the dev ones (pip and PEP 685 compare extras normalized)."""
    normalized = {re.sub(r"[-_.]+", "-", n).lower(): n for n in names}
    test = [normalized[n] for n in TEST_NAMES if n in normalized]
    return test or [normalized[n] for n in DEV_NAMES if n in normalized]


def _group_requirements(groups: dict, name: str, where: Path, seen: tuple[str, ...] = ()) -> list[str]:
    """The requirement strings of dependency group ``name``, includes expanded (PEP 735)."""
    if name in seen:
        raise SandboxSetupError(f"{where}: dependency group {name!r} includes itself")
    entries = groups.get(name)
    if not isinstance(entries, list):
        raise SandboxSetupError(f"{where}: there is no dependency group {name!r}")
    out: list[str] = []
    for entry in entries:
        if isinstance(entry, str):
            out.append(entry)
        elif isinstance(entry, dict) and isinstance(entry.get("include-group"), str):
            out += _group_requirements(groups, entry["include-group"], where, (*seen, name))
    return out


def _lines(value: str) -> list[str]:
    """A multi-line ini value as its non-empty, non-comment lines."""
    return [line.strip() for line in value.splitlines() if line.strip() and not line.strip().startswith("#")]


def _stringify(table: object) -> dict[str, str]:
    """pyproject's pytest options as the ini strings pytest would read (lists joined by lines or
    spaces)."""
    if not isinstance(table, dict):
        return {}
    out = {}
    for key, value in table.items():
        if isinstance(value, list):
            out[key] = ("\n" if key == "required_plugins" else " ").join(str(v) for v in value)
        elif not isinstance(value, dict):
            out[key] = str(value)
    return out


def _wheel_files(options: EnvironmentOptions) -> tuple[tuple[str, int], ...]:
    if options.wheels is None:
        if not options.network:
            raise SandboxSetupError(
                "the environment set-up has no network (setup_network = false) and no wheel folder: "
                'name one with `wheels = "DIR"` in .clover/config.toml or --wheels DIR (make it with '
                "`pip download -d DIR ...`)"
            )
        return ()
    folder = Path(options.wheels)
    if not folder.is_dir():
        raise SandboxSetupError(f"the wheel folder {folder} does not exist or is not a folder")
    return tuple(sorted((p.name, p.stat().st_size) for p in folder.iterdir() if p.is_file()))
