"""make-base-image.sh run by a user who is not root, as on a GitHub-hosted runner (`runner`, with
passwordless sudo and the docker group): a throwaway user is created with a sudoers drop-in that
logs every command, and the script's steps that need root go through sudo while the rest runs as
the user. A user without sudo is refused with a clear message before anything is made. The
mirror is a closed local port, so debootstrap (run through sudo) stops at once: the privilege
logic runs for real, the download does not."""

from __future__ import annotations

import grp
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "sandboxes" / "images" / "make-base-image.sh"

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0
        or not all(shutil.which(t) for t in ("useradd", "userdel", "sudo", "runuser", "debootstrap")),
        reason="needs root (to create a user) with useradd, sudo, runuser and debootstrap installed",
    ),
    # one worker runs both: each compares the leftovers in /var/tmp before and after itself
    pytest.mark.xdist_group("base-image-as-user"),
]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def user() -> Iterator[tuple[str, Path]]:
    """A new user (in the docker group when there is one) and a folder it can read: (name, folder)."""
    name = f"clvt{secrets.token_hex(4)}"
    groups = ["--groups", "docker"] if "docker" in {g.gr_name for g in grp.getgrall()} else []
    subprocess.run(["useradd", "--create-home", *groups, name], check=True)
    folder = Path(tempfile.mkdtemp(prefix="clover-sudo-test-"))
    folder.chmod(0o755)
    try:
        yield name, folder
    finally:
        Path(f"/etc/sudoers.d/{name}").unlink(missing_ok=True)
        subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def grant_sudo(name: str, log: Path) -> None:
    drop_in = Path(f"/etc/sudoers.d/{name}")
    drop_in.write_text(f"Defaults:{name} logfile={log}, loglinelen=0\n{name} ALL=(root) NOPASSWD: ALL\n")
    drop_in.chmod(0o440)
    subprocess.run(["visudo", "-c", "-q", "-f", str(drop_in)], check=True)


def run_as(name: str, folder: Path) -> subprocess.CompletedProcess[str]:
    script = folder / "make-base-image.sh"
    shutil.copy(SCRIPT, script)
    script.chmod(0o755)
    mirror = f"http://127.0.0.1:{closed_port()}/debian"
    return subprocess.run(
        [
            "runuser",
            "-u",
            name,
            "--",
            "env",
            f"DEBIAN_MIRROR={mirror}",
            "FORCE=1",
            "bash",
            str(script),
            f"clover-agent-base:sudo-test-{name}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=folder,
    )


def leftovers() -> set[str]:
    return {p.name for p in Path("/var/tmp").glob("clover-base.*")}


def test_a_user_with_passwordless_sudo_runs_the_root_steps_through_sudo(user: tuple[str, Path]) -> None:
    name, folder = user
    log = folder / "sudo.log"
    grant_sudo(name, log)
    before = leftovers()
    proc = run_as(name, folder)
    output = proc.stdout + proc.stderr
    assert "not root: debootstrap and the root file system's steps run through sudo" in output, output
    assert "debootstrap needs root" not in output and "can only run as root" not in output
    assert proc.returncode != 0  # the mirror refused the download
    commands = [
        line.split("COMMAND=", 1)[1].strip() for line in log.read_text().splitlines() if "COMMAND=" in line
    ]
    debootstrap = [c for c in commands if "debootstrap --variant=minbase" in c]
    assert len(debootstrap) == 1 and "USER=root" in log.read_text(), commands
    rootfs = debootstrap[0].split()[-2]
    assert rootfs.startswith("/var/tmp/clover-base.")
    assert f"/usr/bin/rm -rf {rootfs}" in commands  # the clean-up, as root, at exit
    assert not Path(rootfs).exists() and leftovers() == before


def test_a_user_without_sudo_is_told_what_is_needed(user: tuple[str, Path]) -> None:
    name, folder = user
    before = leftovers()
    proc = run_as(name, folder)
    assert proc.returncode == 1
    assert "run this script as root, or as a user with passwordless sudo" in proc.stderr, proc.stderr
    assert "debootstrap " not in proc.stdout and leftovers() == before
