"""A normal (non-editable) install puts the four sibling folders under clover_agent and nothing
generic at top level; the checkout's root shadows no installed distribution; mypy checks every
package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

from tests.import_layers import SIBLINGS

REPO = Path(__file__).resolve().parents[1]


def _tracked_copy(dest: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    for rel in files:
        src = REPO / rel
        if src.is_symlink():  # the links clover_agent/<name> -> ../<name>: the folders' mapping
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(src), dest / rel)
        elif src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


@pytest.mark.slow
def test_non_editable_install_maps_subpackages(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _tracked_copy(src)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    # Dependencies come from the test environment (appended after the new venv's own packages);
    # clover-agent itself is installed into the new venv from a wheel built from the tracked files.
    (site / "zz_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # Build the wheel with this environment's setuptools (the new venv's bundled one is too old
    # for PEP 639 metadata), then install it the normal way: not editable, no links to the source.
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheels),
            str(src),
        ],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = wheels.glob("clover_agent-*.whl")
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True, cwd=tmp_path)
    for name in SIBLINGS:
        assert not (site / name).exists(), f"generic top-level package {name!r} installed"
        assert (site / "clover_agent" / name).is_dir() and not (site / "clover_agent" / name).is_symlink()
    # Data files the installed package needs at run time travel with it.
    for data in (
        "engine/text/templates/qwen3.6-chat-template.jinja",
        "sandboxes/images/Dockerfile",
        "sandboxes/images/compiler.Dockerfile",
        "sandboxes/images/make-base-image.sh",
    ):
        assert (site / "clover_agent" / data).is_file(), f"{data} missing from the installed package"
    code = (
        "import importlib.util, clover_agent.engine, clover_agent.kernels, clover_agent.tools, "
        "clover_agent.sandboxes, clover_agent\n"
        f"assert clover_agent.__file__.startswith({str(site)!r}), clover_agent.__file__\n"
        # None of ours is importable by its bare name; another distribution's may be (transformers
        # needs Hugging Face's ``kernels``), from the test environment's site-packages, not this one.
        f"for n in {SIBLINGS!r}:\n"
        "    spec = importlib.util.find_spec(n)\n"
        f"    assert spec is None or not str(spec.origin).startswith({str(site)!r}), (n, spec.origin)\n"
        "print('ok')\n"
    )
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_the_mapping_is_the_links_and_the_folders_are_no_packages_of_their_own() -> None:
    assert SIBLINGS == ("engine", "environments", "kernels", "sandboxes", "tools")
    for name in SIBLINGS:
        link = REPO / "clover_agent" / name
        assert os.readlink(link) == f"../{name}" and link.resolve() == REPO / name
        assert not (REPO / name / "__init__.py").exists(), f"{name}/ would shadow an installed {name!r}"


def test_from_the_checkout_root_installed_distributions_import_as_anywhere() -> None:
    """transformers imports Hugging Face's ``kernels``; the root's kernels/ must not stand for it."""
    code = "from transformers import Qwen3_5MoeForCausalLM; import kernels; print(kernels.__file__)"
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "site-packages" in run.stdout and str(REPO / "kernels") not in run.stdout


def test_mypy_checks_every_package() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    packages = {p.name for p in (REPO / "clover_agent").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert {f"clover_agent.{name}" for name in packages} == set(config["packages"])
    assert "mypy_path" not in config  # it reads the checkout as Python imports it: no tree to build
