"""The extras a project's tests need, found from what collecting them imports (no Docker: the
recipe is data; tests/sandboxes/test_environment_docker.py installs a real project's)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from clover_agent.environments.extras import collected_imports, distributions, extra_for, provides
from clover_agent.environments.python_deps import EnvironmentOptions, discover
from tests.git_repos import make_repo

PYPROJECT = (
    '[project]\nname = "demo"\nversion = "1"\ndependencies = ["attrs"]\n'
    "[project.optional-dependencies]\n"
    'test = ["pytest-mock"]\n'
    'yaml = ["PyYAML>=6"]\n'
    'writer = ["tomli-w"]\n'
    'speed = ["orjson; implementation_name == \\"cpython\\""]\n'
    'links = ["linkify-it-py>=1,<3"]\n'
    'all = ["demo[yaml,writer]", "ujson"]\n'
    'docs = ["sphinx"]\n'
)


def pip_args(recipe) -> list[str]:
    words = shlex.split(recipe.steps[0].command)
    if words[0] == "uv":
        assert words[:5] == ["uv", "pip", "install", "--python", "/opt/clover/venv/bin/python"], words
        pip = recipe.steps[0].with_pip
        assert pip is not None and shlex.split(pip.command) == ["python", "-m", "pip", "install", *words[5:]]
        return words[5:]
    assert words[:4] == ["python", "-m", "pip", "install"], words
    return words[4:]


def test_names_match_as_distributions_are_named() -> None:
    assert provides("PyYAML", "yaml") and provides("pyyaml", "yaml.constructor")
    assert provides("linkify-it-py", "linkify_it") and provides("python-dateutil", "dateutil.parser")
    assert provides("ruamel.yaml", "ruamel.yaml") and provides("tomli_w", "tomli_w")
    assert provides("railroad-diagrams", "railroad")
    assert provides("widgets-extra", "widgets") and not provides("widgets-extra", "widgets", loose=False)
    assert not provides("google-cloud-storage", "google.protobuf")  # a namespace is not a match
    assert not provides("pytest-mock", "yaml")
    extras = {"all": ["pyyaml", "tomli-w", "ujson"], "yaml": ["pyyaml"], "diagrams": ["railroad-diagrams"]}
    assert extra_for("yaml", extras) == ("yaml", "pyyaml")  # the smallest extra that has it
    assert extra_for("railroad", extras) == ("diagrams", "railroad-diagrams")
    assert extra_for("numpy", extras) is None


def test_an_extras_self_references_are_followed() -> None:
    declared = {"all": ["demo[yaml, writer]", "ujson"], "yaml": ["PyYAML"], "writer": ["tomli-w>=1"]}
    assert distributions(declared["all"], "Demo", declared) == ["ujson", "PyYAML", "tomli-w"]


def test_unguarded_module_level_imports_of_tests_and_the_project_modules_they_import(tmp_path: Path) -> None:
    files = {
        "tests/test_a.py": "import yaml\nimport os\nfrom demo import conf\nfrom . import helpers\n"
        "try:\n    import ujson\nexcept ImportError:\n    ujson = None\n"
        "def test_x():\n    import sphinx\n",
        "tests/helpers.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import numpy\n"
        "import linkify_it\nimport contextlib\nwith contextlib.suppress(ImportError):\n    import fqdn\n"
        "with open(__file__):\n    import idna\n",
        "src/demo/__init__.py": "",
        "src/demo/conf.py": "try:\n    import tomli_w\nexcept ImportError as e:\n    raise RuntimeError('needs tomli-w') from e\n",
        "src/demo/unused.py": "import orjson\n",
        "tests/data/broken.py": "def (:\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    os.mkfifo(tmp_path / "tests" / "test_fifo.py")  # never opened (it would block)
    (tmp_path / "tests" / "test_link.py").symlink_to(tmp_path / "outside.py")
    (tmp_path / "outside.py").write_text("import numpy\n")
    listed = {*files, "tests/test_fifo.py", "tests/test_link.py"}
    found = collected_imports(tmp_path, listed, {"demo", "tests"})
    assert set(found) == {"yaml", "tomli_w", "linkify_it", "idna"}, found
    assert found["tomli_w"] == "src/demo/conf.py"


def test_the_extras_the_tests_import_are_installed_with_the_test_extra(tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "r",
        {
            "pyproject.toml": PYPROJECT,
            "src/demo/__init__.py": "import attr\n",
            "src/demo/out.py": "import tomli_w\n",
            "tests/test_a.py": "import yaml, attr, pytest\nimport demo.out\n",
            "tests/test_b.py": "try:\n    import orjson\nexcept ImportError:\n    orjson = None\n",
        },
    )
    recipe = discover(repo, EnvironmentOptions())
    assert recipe is not None
    assert pip_args(recipe) == ["-e", ".[test,yaml,writer]", "pytest"]
    spelled = discover(repo, EnvironmentOptions(extras=("python_ulid", "Dev")))
    assert pip_args(spelled)[1] == ".[python_ulid,python-ulid,Dev]"  # as pip 23.0 compares them
    assert recipe.extras == ("test", "yaml", "writer")
    assert "its extra yaml: the tests import yaml (PyYAML)" in recipe.found
    assert "its extra writer: the tests import tomli_w (tomli-w)" in recipe.found
    assert "its extras test" in recipe.found
    assert dict(recipe.other_extras) == {
        "speed": ("orjson",),
        "links": ("linkify-it-py",),
        "all": ("ujson", "PyYAML", "tomli-w"),
        "docs": ("sphinx",),
    }
    # chosen in .clover/config.toml: those extras only, the others still known for the diagnosis
    chosen = discover(repo, EnvironmentOptions(extras=("test",)))
    assert pip_args(chosen) == ["-e", ".[test]", "pytest"]
    assert "yaml" in dict(chosen.other_extras)


def test_a_module_the_base_dependencies_or_requirement_files_provide_adds_no_extra(tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "r",
        {
            "pyproject.toml": PYPROJECT.replace('dependencies = ["attrs"]', 'dependencies = ["pyyaml"]'),
            "requirements-test.txt": "tomli-w==1.0\n",
            "tests/test_a.py": "import yaml\nimport tomli_w\n",
        },
    )
    assert pip_args(discover(repo, EnvironmentOptions())) == [
        "-e",
        ".[test]",
        "-r",
        "requirements-test.txt",
        "pytest",
    ]
    (repo / "tests" / "test_b.py").write_text("import linkify_it\n")
    assert pip_args(discover(repo, EnvironmentOptions()))[1] == ".[test,links]"
    assert pip_args(discover(repo, EnvironmentOptions(packages=("linkify-it-py",))))[1] == ".[test]"


def test_an_extra_name_pip_would_not_take_is_never_offered(tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "r",
        {
            "pyproject.toml": '[project]\nname = "d"\nversion = "1"\n[project.optional-dependencies]\n'
            '"x];touch /tmp/pwned;[\\u001b[31m" = ["pyyaml"]\n',
            "tests/test_a.py": "import yaml\n",
        },
    )
    recipe = discover(repo, EnvironmentOptions())
    assert pip_args(recipe) == ["-e", ".", "pytest"]
    assert recipe.other_extras == ()
    assert not any("\x1b" in line or "pwned" in line for line in recipe.found)


def test_setup_cfg_extras_and_tox_deps_with_extras_the_repository_chose(tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "r",
        {
            "setup.cfg": "[metadata]\nname = demo\n[options.extras_require]\nyaml =\n    PyYAML\n",
            "setup.py": "from setuptools import setup\nsetup()\n",
            "tox.ini": "[testenv]\nextras = yaml\ndeps =\n    mock\n",
            "tests/test_a.py": "import yaml\n",
        },
    )
    (repo / "tox.ini").write_text("[testenv]\nextras = yaml, {env:MORE:}\ndeps =\n    mock\n")
    recipe = discover(repo, EnvironmentOptions())
    assert pip_args(recipe) == ["-e", ".[yaml]", "mock", "pytest"]  # tox's extras, tox's deps
    chosen = discover(repo, EnvironmentOptions(extras=()))
    assert pip_args(chosen) == ["-e", ".", "mock", "pytest"]  # tox's deps still, not its extras
    assert dict(chosen.other_extras) == {"yaml": ("PyYAML",)}


def test_the_install_step_names_every_package_it_installs(tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "r",
        {
            "pyproject.toml": '[project]\nname = "d"\nversion = "1"\n'
            '[dependency-groups]\ntest = ["hypothesis>=6", "freezegun"]\n'
            '[tool.pytest.ini_options]\naddopts = "-n 2"\n',
            "requirements-test.txt": "mock\n",
        },
    )
    recipe = discover(repo, EnvironmentOptions(packages=("pytest-timeout",)))
    assert recipe.steps[0].title == (
        "uv pip install the project (editable), requirements-test.txt, hypothesis>=6, freezegun, "
        "pytest-timeout, pytest-xdist, pytest"
    )
    assert recipe.with_installer("pip").steps[0].title == recipe.steps[0].title.removeprefix("uv ")


def test_a_setup_py_literal_extras_require_is_read_never_run(tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "r",
        {
            "setup.py": "import sys\nfrom setuptools import setup\n"
            "EXTRAS = {'yaml': ['PyYAML'], 'fast': 'orjson'}\n"
            "open('ran', 'w')\nsetup(name='demo', extras_require=EXTRAS)\n",
            "tests/test_a.py": "import yaml\n",
        },
    )
    recipe = discover(repo, EnvironmentOptions())
    assert pip_args(recipe) == ["-e", ".[yaml]", "pytest"]
    assert dict(recipe.other_extras) == {"fast": ("orjson",)}
    assert "test extras" in recipe.steps[1].title  # the built metadata's test extras, as before
    assert not (repo / "ran").exists()
