"""``InPlaceSandbox``: the sandbox interface over the folder itself, with no copy and no isolation.

Only ``clover-agent run --sandbox none`` makes one, for a harness that installs the agent inside a
container it throws away (Terminal-Bench's ``/app``): there the container is the sandbox, and the
agent's commands run directly in the folder, as this user, with this process's network. Nothing
protects the folder or anything else on the machine. Unlike :class:`LocalSandbox` it records no
starting commit (nothing is written into the folder's ``.git``, nor a ``.git`` made in a folder
without one); the host takes stock of the folder before and after (``handback.stock``), so the
patch is computed as for any sandbox.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from pathlib import Path

from clover_agent.sandboxes import cleanup
from clover_agent.sandboxes.base import require_repo
from clover_agent.sandboxes.errors import SandboxError, WorkspaceDiffError
from clover_agent.sandboxes.local import LocalSandbox, reap_stale_copies
from clover_agent.sandboxes.workspace import DIFF_COMMAND, GIT_IDENTITY, add_all_command, copy_index_command

log = logging.getLogger(__name__)

INPLACE_WARNING = (
    "no sandbox (--sandbox none): the agent's commands run directly in the folder, as this user, with "
    "this machine's network; no isolation: for use inside a container you throw away"
)
_TEMP_PREFIX = "clover-agent-inplace-"
#: Records the folder's starting state in a private repository outside it (``$CLOVER_BASELINE``),
#: whose work tree is the folder: the folder's own ``.git`` (if any) is neither read nor written.
_BASELINE = f"""set -e
cd "$WORKSPACE"
export GIT_DIR="$CLOVER_BASELINE" GIT_WORK_TREE="$WORKSPACE"
git init -q
git config core.hooksPath /dev/null
git config core.fsmonitor false
mkdir -p "$GIT_DIR/info"
printf '%s\\n' "* !filter !diff" > "$GIT_DIR/info/attributes"
{add_all_command('"$GIT_DIR/add.err"')}git {GIT_IDENTITY} commit -q --no-verify --allow-empty -m "clover-agent: starting state"
git rev-parse HEAD
"""


class InPlaceSandbox(LocalSandbox):
    """:class:`LocalSandbox`'s runner started in ``spec.repo`` itself (``/workspace`` is that folder);
    the temporary folder it makes holds only the commands' ``TMPDIR`` and is removed on close."""

    warning = INPLACE_WARNING

    async def start(self) -> None:
        log.warning(INPLACE_WARNING)
        spec = self.spec
        require_repo(spec)
        await asyncio.to_thread(reap_stale_copies, _TEMP_PREFIX)
        self._folder = Path(tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{os.getpid()}-")).resolve()
        self._cleanup_token = cleanup.register(self._close_now)
        private_tmp = self._folder / "tmp"
        private_tmp.mkdir(mode=0o700)
        workspace = Path(spec.repo).resolve()
        self.host_workspace = workspace
        try:
            await self._start_runner(workspace, private_tmp)
            result = await self.exec(_BASELINE, env=self._git_env())
            if result.exit_code != 0:
                raise SandboxError(f"could not record the folder's starting state:\n{result.output[-2000:]}")
            self.base_commit = result.output.strip().splitlines()[-1]
        except BaseException:
            await self.close()
            raise

    def _git_env(self) -> dict[str, str]:
        assert self._folder is not None
        return {"CLOVER_BASELINE": str(self._folder / "baseline.git")}

    async def diff(self) -> str:
        """The folder's diff against its start, from the private repository (never the folder's own
        ``.git``): the trajectory's record, as :meth:`SessionSandbox.diff`'s."""
        if self.base_commit is None or self._folder is None:
            raise SandboxError("the in-place sandbox is not started (or already closed)")
        script = f"""set -e
cd "$WORKSPACE"
export GIT_DIR="$CLOVER_BASELINE" GIT_WORK_TREE="$WORKSPACE"
index=$(mktemp)
trap 'rm -f "$index"' EXIT
{copy_index_command('"$GIT_DIR/index"', '"$index"')}
export GIT_INDEX_FILE=$index
{add_all_command('"$index.err"')}{DIFF_COMMAND} {self.base_commit}
"""
        result = await self.exec(script, env=self._git_env())
        if result.exit_code != 0:
            why = result.killed_reason or result.disk_full or f"exit {result.exit_code}"
            raise WorkspaceDiffError(f"git diff failed in the folder ({why}):\n{result.output[-2000:]}")
        return result.output
