"""What the environment set-up finds to install in a Python project's files (no Docker needed: the
recipe is data; tests/sandboxes/test_environment_docker.py runs recipes for real)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from clover_agent.environments.python_deps import EnvironmentOptions, discover
from clover_agent.environments.recipe import EnvironmentRecipe, PackageIndex
from clover_agent.sandboxes.errors import SandboxSetupError
from tests.git_repos import git, make_repo


def pip_args(recipe: EnvironmentRecipe) -> list[str]:
    """The arguments of the recipe's first step, ``uv pip install --python VENV/bin/python ARGS``
    (the same as its pip form's, ``python -m pip install ARGS``), or a pip recipe's."""
    words = shlex.split(recipe.steps[0].command)
    if words[0] == "uv":
        assert words[:5] == ["uv", "pip", "install", "--python", "/opt/clover/venv/bin/python"], words
        pip = recipe.steps[0].with_pip
        assert pip is not None and shlex.split(pip.command) == ["python", "-m", "pip", "install", *words[5:]]
        return words[5:]
    assert words[:4] == ["python", "-m", "pip", "install"], words
    return words[4:]


def test_pyproject_project_installed_editable_with_its_test_extra_and_pytest(tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "r",
        {
            "pyproject.toml": '[project]\nname = "demo"\nversion = "1"\n'
            '[project.optional-dependencies]\ntest = ["freezegun"]\ndocs = ["sphinx"]\ndev = ["black"]\n',
            "src/demo/__init__.py": "",
        },
    )
    recipe = discover(repo, EnvironmentOptions())
    assert recipe is not None
    assert pip_args(recipe) == ["-e", ".[test]", "pytest"]
    assert "its extras test" in recipe.found
    assert [path for path, _ in recipe.key_files] == ["pyproject.toml"]


def test_dev_extra_when_there_is_no_test_extra_and_names_compare_normalized(tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "r",
        {
            "pyproject.toml": '[project]\nname = "d"\nversion = "1"\n[project.optional-dependencies]\nDev = ["x"]\n'
        },
    )
    assert pip_args(discover(repo, EnvironmentOptions())) == ["-e", ".[Dev]", "pytest"]


def test_dependency_groups_with_includes_requirement_files_and_what_they_include(tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "r",
        {
            "pyproject.toml": '[build-system]\nrequires = ["setuptools"]\n'
            '[dependency-groups]\nlint = ["ruff"]\nbase = ["attrs>=22"]\n'
            'test = ["hypothesis", {include-group = "base"}]\n',
            "requirements.txt": "-r requirements/common.txt\n",
            "requirements/common.txt": "six\n",
            "requirements/test.txt": "-c ../constraints.txt\nmock\n",
            "constraints.txt": "mock<6\n",
            "requirements-docs.txt": "sphinx\n",
        },
    )
    recipe = discover(repo, EnvironmentOptions())
    args = pip_args(recipe)
    assert args == [
        "-e",
        ".",
        "-r",
        "requirements.txt",
        "-r",
        "requirements/test.txt",
        "hypothesis",
        "attrs>=22",
        "pytest",
    ]
    hashed = {path for path, _ in recipe.key_files}
    assert {"requirements/common.txt", "constraints.txt", "requirements/test.txt"} <= hashed
    assert "requirements-docs.txt" not in hashed


def test_setup_py_only_project_reads_its_extras_from_the_built_metadata(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", {"setup.py": "from setuptools import setup\nsetup(name='x')\n"})
    recipe = discover(repo, EnvironmentOptions())
    assert pip_args(recipe) == ["-e", ".", "pytest"]
    assert len(recipe.steps) == 2 and "extras" in recipe.steps[1].title


def test_setup_cfg_extras_and_tox_deps_when_nothing_names_test_dependencies(tmp_path: Path) -> None:
    cfg = make_repo(
        tmp_path / "cfg",
        {
            "setup.py": "from setuptools import setup\nsetup()\n",
            "setup.cfg": "[metadata]\nname = x\n[options.extras_require]\ntesting =\n    pytest-mock\n",
        },
    )
    assert pip_args(discover(cfg, EnvironmentOptions())) == ["-e", ".[testing]", "pytest"]
    tox = make_repo(
        tmp_path / "tox",
        {
            "tox.ini": "[testenv]\ndeps =\n    pytest-xdist\n    {env:EXTRA:}\n    # a comment\n",
            "t_test.py": "",
        },
    )
    recipe = discover(tox, EnvironmentOptions())
    assert pip_args(recipe) == ["pytest-xdist", "pytest"]  # not installable: no -e .
    assert "tox.ini's [testenv] deps" in recipe.found


def test_plugins_the_pytest_configuration_needs(tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "r",
        {
            "pyproject.toml": '[project]\nname = "d"\nversion = "1"\n[tool.pytest.ini_options]\n'
            'addopts = "--cov=d --benchmark-skip -p no:cacheprovider"\nasyncio_mode = "auto"\n'
            'required_plugins = ["pytest-html>=3"]\nminversion = "8.0"\n',
        },
    )
    args = pip_args(discover(repo, EnvironmentOptions()))
    assert args[2:] == [
        "pytest-html>=3",
        "pytest-cov",
        "pytest-benchmark",
        "pytest-asyncio",
        "pytest>=8.0",
        "pytest",
    ]


def test_pytest_9_table_and_ini_files_are_read_too(tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "r",
        {
            "pyproject.toml": '[tool.pytest]\naddopts = ["-n", "2"]\n',
            "pytest.ini": "[pytest]\naddopts = --timeout=30\n",
            "test_x.py": "",
        },
    )
    assert pip_args(discover(repo, EnvironmentOptions())) == ["pytest-xdist", "pytest-timeout", "pytest"]


def test_files_git_ignores_are_not_looked_at(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", {".gitignore": "requirements-dev.txt\n", "test_x.py": ""})
    (repo / "requirements-dev.txt").write_text("private-package\n")
    recipe = discover(repo, EnvironmentOptions())
    assert pip_args(recipe) == ["pytest"]  # a bare Python project: pytest only
    assert recipe.key_files == ()


def test_no_environment_for_a_project_without_python_or_when_turned_off(tmp_path: Path) -> None:
    assert (
        discover(make_repo(tmp_path / "go", {"go.mod": "module x\n", "x.go": ""}), EnvironmentOptions())
        is None
    )
    python = make_repo(tmp_path / "py", {"test_x.py": ""})
    assert discover(python, EnvironmentOptions(enabled=False)) is None


def test_options_from_the_repository_config_replace_the_findings(tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "r",
        {
            "pyproject.toml": '[project]\nname = "d"\nversion = "1"\n[project.optional-dependencies]\ntest = ["x"]\n',
            "requirements-test.txt": "y\n",
            "ci/reqs.txt": "z\n",
        },
    )
    options = EnvironmentOptions(
        extras=("full",), requirements=("ci/reqs.txt",), packages=("pytest<8",), setup=("make gen",)
    )
    recipe = discover(repo, options)
    assert pip_args(recipe) == ["-e", ".[full]", "-r", "ci/reqs.txt", "pytest<8", "pytest"]
    assert recipe.steps[-1].command == "make gen"
    assert pip_args(discover(repo, EnvironmentOptions(install_project=False)))[:2] == [
        "-r",
        "requirements-test.txt",
    ]
    with pytest.raises(SandboxSetupError, match=r"missing\.txt"):
        discover(repo, EnvironmentOptions(requirements=("missing.txt",)))


def test_broken_dependency_files_are_named(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", {"pyproject.toml": "[project\n", "x.py": ""})
    with pytest.raises(SandboxSetupError, match=r"pyproject.toml is not valid TOML"):
        discover(repo, EnvironmentOptions())
    groups = make_repo(
        tmp_path / "g", {"pyproject.toml": '[dependency-groups]\ntest = [{include-group = "nope"}]\n'}
    )
    with pytest.raises(SandboxSetupError, match="no dependency group 'nope'"):
        discover(groups, EnvironmentOptions())


def test_offline_needs_a_wheel_folder_and_its_files_enter_the_key(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", {"test_x.py": ""})
    with pytest.raises(SandboxSetupError, match=r"no network .* and no wheel folder"):
        discover(repo, EnvironmentOptions(network=False))
    with pytest.raises(SandboxSetupError, match="does not exist"):
        discover(repo, EnvironmentOptions(wheels=str(tmp_path / "none")))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "pytest-8.0-py3-none-any.whl").write_bytes(b"x")
    offline = discover(repo, EnvironmentOptions(wheels=str(wheels), network=False))
    assert offline.offline and offline.wheel_files == (("pytest-8.0-py3-none-any.whl", 1),)
    before = offline.cache_key("sha256:base")
    (wheels / "pluggy-1.5-py3-none-any.whl").write_bytes(b"y")
    assert (
        discover(repo, EnvironmentOptions(wheels=str(wheels), network=False)).cache_key("sha256:base")
        != before
    )
    assert "no-index = true" in offline.pip_conf() and "/tmp/clover-setup/wheels" in offline.pip_conf()


def test_cache_key_follows_dependency_files_base_image_and_index_not_other_files(tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "r",
        {"pyproject.toml": '[project]\nname = "d"\nversion = "1"\n', "README.md": "hi\n", "d.py": ""},
    )
    key = discover(repo, EnvironmentOptions()).cache_key("sha256:a")
    (repo / "README.md").write_text("changed\n")
    (repo / "d.py").write_text("x = 1\n")
    assert discover(repo, EnvironmentOptions()).cache_key("sha256:a") == key
    assert discover(repo, EnvironmentOptions()).cache_key("sha256:b") != key
    index = PackageIndex(index_url="https://user:secret@mirror.example/simple")
    with_index = discover(repo, EnvironmentOptions(index=index)).cache_key("sha256:a")
    assert with_index != key
    rotated = PackageIndex(index_url="https://user:other@mirror.example/simple")
    assert discover(repo, EnvironmentOptions(index=rotated)).cache_key("sha256:a") == with_index
    (repo / "pyproject.toml").write_text('[project]\nname = "d"\nversion = "2"\n')
    assert discover(repo, EnvironmentOptions()).cache_key("sha256:a") != key
    git(repo, "status")  # the repository is intact


def test_tox_deps_of_the_plain_environment_factor_lines_left_out(tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "r",
        {
            "pyproject.toml": '[project]\nname = "d"\nversion = "1"\n'
            '[project.optional-dependencies]\nfast = ["x"]\nextra2 = ["y"]\n',
            "tox.ini": "[tox]\nenv_list = py{311,312}-{fast,slow}\n[testenv]\nextras = fast\ndeps =\n"
            "    coverage[toml]>=7\n    fast: Unidecode>=1.1\n    slow,py312-fast: anyascii\n"
            "    !fast: nose-free\n    -r{toxinidir}/requirements/base-tox.txt\n    -e .\n"
            "    py{311,312}: pinned\n    git+https://example.invalid/x.git\n",
            "requirements/base-tox.txt": "mock\n",
            "dev.requirements.txt": "tox\nmypy\n",
        },
    )
    recipe = discover(repo, EnvironmentOptions())
    assert pip_args(recipe) == [
        "-e", ".[fast]", "-r", "requirements/base-tox.txt", "coverage[toml]>=7", "nose-free",
        "git+https://example.invalid/x.git", "pytest",
    ]  # fmt: skip
    assert "its extras fast" in recipe.found
    assert (
        "tox.ini's [testenv] deps (the plain environment: lines for fast, slow,py312-fast, py{311,312} left out)"
        in recipe.found
    )
    assert "requirements/base-tox.txt" in dict(recipe.key_files)


def test_tox_in_setup_cfg_and_pyproject(tmp_path: Path) -> None:
    cfg = make_repo(
        tmp_path / "cfg",
        {"setup.cfg": "[tox:tox]\nenvlist = py\n[testenv]\ndeps =\n    six\n    py: ignored\n", "t.py": ""},
    )
    assert pip_args(discover(cfg, EnvironmentOptions())) == ["six", "pytest"]
    native = make_repo(
        tmp_path / "native",
        {"pyproject.toml": '[tool.tox.env_run_base]\ndeps = ["attrs", "cov: coverage"]\n', "t.py": ""},
    )
    assert pip_args(discover(native, EnvironmentOptions())) == ["attrs", "pytest"]
    legacy = make_repo(
        tmp_path / "legacy",
        {
            "pyproject.toml": '[tool.tox]\nlegacy_tox_ini = """\n[testenv]\ndeps = hypothesis\n"""\n',
            "t.py": "",
        },
    )
    assert pip_args(discover(legacy, EnvironmentOptions())) == ["hypothesis", "pytest"]


def test_test_requirement_files_win_over_dev_ones(tmp_path: Path) -> None:
    files = {
        "setup.py": "from setuptools import setup\nsetup(name='d')\n",
        "requirements.txt": "six\n",
        "requirements/dev.txt": "-e .\nd==1.0\n",  # the project itself, pinned
        "tests.txt": "mock\n",
        "tests/requirements.txt": "attrs\n",
    }
    repo = make_repo(tmp_path / "r", files)
    assert pip_args(discover(repo, EnvironmentOptions()))[:8] == [
        "-e", ".", "-r", "requirements.txt", "-r", "tests.txt", "-r", "tests/requirements.txt",
    ]  # fmt: skip
    del files["tests.txt"], files["tests/requirements.txt"]
    dev_only = make_repo(tmp_path / "dev", files)
    recipe = discover(dev_only, EnvironmentOptions())
    assert (
        recipe is not None
        and "requirements/dev.txt (without the project's own line)" in recipe.steps[0].title
    )
    assert recipe.files == (("requirements-1.txt", "d==1.0\n"),)  # given to pip without its `-e .`


SCM_PYPROJECT = (
    '[build-system]\nrequires = ["setuptools>=64", "setuptools-scm>=8"]\n'
    'build-backend = "setuptools.build_meta"\n[project]\nname = "Demo.Scm"\ndynamic = ["version"]\n'
)


def test_a_setuptools_scm_version_from_the_last_tag_else_pkg_info_and_in_the_key(tmp_path: Path) -> None:
    variable = "SETUPTOOLS_SCM_PRETEND_VERSION_FOR_DEMO_SCM"
    repo = make_repo(
        tmp_path / "r",
        {
            "pyproject.toml": SCM_PYPROJECT,
            "PKG-INFO": "Metadata-Version: 2.1\nName: Demo.Scm\nVersion: 2.0.1\n\nv9\n",
        },
    )
    plain = "SETUPTOOLS_SCM_PRETEND_VERSION"  # what old setuptools-scm and setup.py's use_scm_version read
    from_pkg_info = discover(repo, EnvironmentOptions())
    assert from_pkg_info.variables == ((plain, "2.0.1"), (variable, "2.0.1"))
    assert from_pkg_info.setup_env()[variable] == from_pkg_info.setup_env()[plain] == "2.0.1"
    assert f"its version 2.0.1, from PKG-INFO ({variable} and {plain}; checked after the install)" in (
        from_pkg_info.found
    )
    check = from_pkg_info.steps[-1]  # after the install: the installed metadata must agree
    assert check.title == "check that the installed Demo.Scm says version 2.0.1"
    assert check.command.endswith(" Demo.Scm 2.0.1")
    git(repo, "tag", "v2.1.0")
    from_tag = discover(repo, EnvironmentOptions())
    assert from_tag.variables == ((plain, "2.1.0"), (variable, "2.1.0"))
    assert any(line.startswith("its version 2.1.0, from the last tag, v2.1.0") for line in from_tag.found)
    assert from_tag.cache_key("sha256:a") != from_pkg_info.cache_key("sha256:a")
    # hatch-vcs, with neither: said, nothing pretended
    hatch = make_repo(
        tmp_path / "hatch",
        {
            "pyproject.toml": '[build-system]\nrequires = ["hatchling", "hatch-vcs"]\n'
            'build-backend = "hatchling.build"\n[project]\nname = "h"\ndynamic = ["version"]\n'
            '[tool.hatch.version]\nsource = "vcs"\n'
        },
    )
    unknown = discover(hatch, EnvironmentOptions())
    assert unknown.variables == ()
    assert any("no tag and no PKG-INFO" in line for line in unknown.found)
    # a static version, or no scm tool: nothing to pretend, and the key is as before
    static = make_repo(tmp_path / "static", {"pyproject.toml": '[project]\nname = "s"\nversion = "1"\n'})
    git(static, "tag", "v3")
    assert discover(static, EnvironmentOptions()).variables == ()


def test_requirement_lines_naming_the_project_itself_join_its_editable_install(tmp_path: Path) -> None:
    """python-utils 3.8.2's shape: requirements.txt is ``.`` and the tests' file ``-e .[tests]``;
    given to pip beside ``-e .`` they install the project a second time, not editable, which pip
    refuses ("Cannot install python-utils 3.8.2 (from /workspace) and ..."). The extras join the
    editable install, a file holding nothing else is left out, the rest of one goes to pip as a
    copy without that line, its includes made absolute (pip reads them from the file's folder)."""
    repo = make_repo(
        tmp_path / "r",
        {
            "pyproject.toml": '[project]\nname = "demo"\nversion = "1"\n'
            '[project.optional-dependencies]\ntests = ["pytest-cov"]\nyaml = ["pyyaml"]\n',
            "demo.py": "",
            "requirements.txt": "# the project\n.\n",
            "tests/requirements.txt": "-e .[tests] # with its test extra\n-r ../requirements/common.txt\nmock\n",
            "requirements/common.txt": "six\n",
            "tests/test_demo.py": "import demo\n",
        },
    )
    recipe = discover(repo, EnvironmentOptions())
    assert recipe is not None
    args = pip_args(recipe)
    assert args[:2] == ["-e", ".[tests]"] and "requirements.txt" not in args, args
    assert args[2:4] == ["-r", "/tmp/clover-setup/requirements-1.txt"], args
    assert recipe.files == (("requirements-1.txt", "-r /workspace/requirements/common.txt\nmock\n"),)
    assert "requirements.txt names only the project itself (`.`): installed editable" in recipe.found
    assert (
        "tests/requirements.txt names the project itself (`-e .[tests] # with its test extra`): installed "
        "editable, that line left out" in recipe.found
    )
    assert "tests/requirements.txt (without the project's own line)" in recipe.steps[0].title
    # the copy is part of the key: the same files, the same key; a changed file, another
    base = "sha256:" + "0" * 64
    again = discover(repo, EnvironmentOptions())
    assert again is not None and again.cache_key(base) == recipe.cache_key(base)
    (repo / "tests" / "requirements.txt").write_text("-e .[tests]\nmock>=5\n")
    git(repo, "commit", "-qam", "mock>=5")
    changed = discover(repo, EnvironmentOptions())
    assert changed is not None and changed.cache_key(base) != recipe.cache_key(base)
    assert changed.files == (("requirements-1.txt", "mock>=5\n"),)
