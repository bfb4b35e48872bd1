"""A hostile repository's uv configuration is never read by the set-up's uv: its ``uv.toml``,
its ``[tool.uv]`` settings and ``[tool.uv.sources]``, its ``.python-version``. Each would break the
install here (no index, an unreachable git source, a Python the image has not), so uv setting the
project up by itself (no fallback to pip) shows none was read."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from clover_agent.sandboxes.factory import create_sandbox
from tests.git_repos import make_repo
from tests.sandboxes.test_env_installer import INSTALLER_OF, spec_for
from tests.sandboxes.test_environment_docker import (
    own_leftovers,
    remove_environment_images,  # noqa: F401 (the autouse fixture: this module's images removed)
)

pytestmark = [pytest.mark.docker, pytest.mark.index, pytest.mark.slow]

NOWHERE = "http://127.0.0.1:9/simple/"


async def test_the_repositorys_uv_configuration_is_not_read(tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "hostile",
        {
            "pyproject.toml": '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n'
            f'[project]\nname = "demo-uv"\nversion = "0.3"\ndescription = "{uuid.uuid4().hex}"\n'
            'dependencies = ["text-unidecode==1.3"]\n'
            f'[tool.uv]\nindex-url = "{NOWHERE}"\n[tool.uv.pip]\nno-index = true\n'
            '[tool.uv.sources]\ntext-unidecode = { git = "https://127.0.0.1:9/nothing.git" }\n',
            "uv.toml": f'index-url = "{NOWHERE}"\n[pip]\nno-index = true\npython = "3.4"\n',
            ".python-version": "3.4\n",
            "src/demo_uv/__init__.py": "from text_unidecode import unidecode\n",
            "tests/test_demo.py": "import demo_uv\n\ndef test_it():\n    assert demo_uv.unidecode('é') == 'e'\n",
            ".gitignore": "*.egg-info/\n",
        },
    )
    said: list[str] = []
    async with create_sandbox("docker", spec_for(repo, said)) as sb:
        tests = await sb.exec("python -m pytest -q -p no:cacheprovider")
        assert tests.exit_code == 0 and "1 passed" in tests.output, tests.output
        assert (await sb.exec(f"{INSTALLER_OF} text-unidecode")).output.strip() == "uv"
        url = await sb.exec(
            "python -c \"import importlib.metadata as m; print(m.distribution('text-unidecode').read_text('direct_url.json'))\""
        )
        assert "git" not in url.output, url.output
    assert any(m.startswith("environment: installer uv ") for m in said), said
    assert not any("fallback, tries it" in m for m in said), said
    assert own_leftovers() == []
