"""Real hook scripts for the tests: small executables written into a test's folder."""

from __future__ import annotations

import stat
from pathlib import Path

#: The well-known Claude Code denylist hook, as people write it for Claude Code: it reads the Bash
#: command from stdin's ``.tool_input.command`` with python, and exits 2 with the reason on stderr.
CLAUDE_DENYLIST = """#!/usr/bin/env bash
command=$(python3 -c 'import json,sys; print(json.load(sys.stdin).get("tool_input",{}).get("command",""))')
if echo "$command" | grep -Eq 'rm[[:space:]]+-rf'; then
  echo "Blocked: rm -rf is not allowed here; delete files one by one" >&2
  exit 2
fi
exit 0
"""


def script(folder: Path, name: str, body: str) -> Path:
    """An executable file ``name`` in ``folder`` holding ``body`` (a ``#!`` line is added when missing)."""
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body if body.startswith("#!") else "#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP)
    return path


def recorder(folder: Path, name: str, log: Path, tail: str = "exit 0\n") -> Path:
    """A hook that appends its stdin (one JSON object, on one line) to ``log``, then runs ``tail``."""
    save = (
        f"python3 -c 'import sys; open(sys.argv[1], \"a\").write(sys.stdin.read().strip() + chr(10))' {log}"
    )
    return script(folder, name, f"{save}\n{tail}")


def logged(log: Path) -> list[dict]:
    """What a :func:`recorder` hook was given, one object per run."""
    import json

    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
