"""``DockerSandbox``: the default, isolated sandbox on the Docker Engine API.

One container per task, started from a locally built image (``clover-agent sandbox build``) or a
recipe's environment image (:mod:`clover_agent.sandboxes.env_image`): the repository copied into a
size-limited tmpfs volume at ``/workspace`` (the user's tree is never mounted), an unprivileged,
read-only, network-less container with resource limits, whose main process is the runner
(:mod:`clover_agent.sandboxes.runner`), attached once. Containers are labelled and removed on
close, on signals and at exit, and reaped after killed runs. Every Engine API call goes through
:class:`~clover_agent.sandboxes.docker_api.EngineCalls`. The isolation, the disk limit and the
set-up network are in sandboxes/README.md. A container's whole life (create, fill, attach, lose,
remove) is one class whose steps share its state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import socket
import tempfile
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clover_agent.environments.recipe import SETUP_DIR, WORKSPACE_OVERLAY
from clover_agent.sandboxes import cleanup, env_image
from clover_agent.sandboxes.base import WORKSPACE, Attached, SandboxError, SandboxSpec, require_repo
from clover_agent.sandboxes.docker_api import QUICK, SLOW, EngineCalls, slow_timeout
from clover_agent.sandboxes.errors import SandboxConfigError, SandboxSetupError, SandboxUnavailable
from clover_agent.sandboxes.images import DEFAULT_SANDBOX_IMAGE, compiler_image, compiler_tag
from clover_agent.sandboxes.session import WRITE_CHUNK_BYTES, RunnerSession, SessionSandbox, runner_command
from clover_agent.sandboxes.workspace import (
    LARGE_COPY_BYTES,
    SparseFile,
    WorkspacePlan,
    plan_workspace,
    read_segment,
    write_workspace_tar,
)

if TYPE_CHECKING:
    import docker

try:
    from docker.errors import DockerException
except ImportError:  # reported by docker_client() when a sandbox is started
    DockerException = OSError  # type: ignore[assignment,misc]

log = logging.getLogger(__name__)

SANDBOX_UID = 1000
SANDBOX_GID = 1000
LABEL = "clover-agent"
LABEL_OWNER_PID = "clover-agent.owner-pid"
LABEL_HOST = "clover-agent.host"
LABEL_RUN_ID = "clover-agent.run-id"
TMP_SIZE = "1g"
_LOCAL_HINT = "or run with `--sandbox local` (no isolation: commands run on this machine)"


def docker_client(environment: Mapping[str, str], *, offer_local: bool = True) -> docker.DockerClient:
    """A client for a Docker engine that answers, or :class:`SandboxUnavailable` saying how to fix it.

    - ``environment``: the caller's (:attr:`SandboxSpec.host_env`): the engine's address (``DOCKER_HOST``,
      ``DOCKER_TLS_VERIFY``, ``DOCKER_CERT_PATH``; none of them: the default socket) and the API calls'
      deadline (``CLOVER_DOCKER_TIMEOUT``, :mod:`clover_agent.sandboxes.docker_api`).
    - ``offer_local``: add "or run with ``--sandbox local``" to the fix: right for the commands that
      take that option (``fix``, ``tool``), wrong for ``sandbox build|prune``, which need Docker itself.
    """
    way_out = f", {_LOCAL_HINT}" if offer_local else ""
    try:
        import docker
    except ImportError as exc:
        raise SandboxUnavailable(
            f"the `docker` Python package is missing ({exc}): reinstall clover-agent "
            f"(`pip install clover-agent`){way_out}"
        ) from None
    where = environment.get("DOCKER_HOST") or "the default socket (unix:///var/run/docker.sock)"
    try:
        slow = slow_timeout(environment)
        # A ping is quick. (Docker takes float timeouts, as requests does; its stubs say int.)
        client = docker.from_env(timeout=slow / 4, environment=dict(environment))  # type: ignore[arg-type]
        client.ping()
        # the default for calls not made through EngineCalls
        client.api.timeout = slow  # type: ignore[assignment]
    except (DockerException, OSError) as exc:
        raise SandboxUnavailable(
            f"no Docker engine answers at {where} ({_unreachable_reason(exc)}). Install Docker and start it "
            "(e.g. `sudo systemctl start docker`), give your user access to its socket, or point "
            f"DOCKER_HOST at a running engine{way_out}"
        ) from None
    return client


#: What the low-level reason for an engine not answering means, most specific first.
_REASONS: tuple[tuple[type[BaseException], str], ...] = (
    (FileNotFoundError, "its socket does not exist"),
    (PermissionError, "permission denied on its socket: is your user in the docker group?"),
    (ConnectionRefusedError, "connection refused: nothing listens there"),
    (socket.gaierror, "the host name does not resolve"),
    (TimeoutError, "no answer in time"),
    (ConnectionError, "the connection failed"),
)


def _unreachable_reason(exc: BaseException) -> str:
    """Why an engine did not answer, in words: the docker package wraps the operating system's
    error in two or three layers of library errors whose text is a Python repr of a tuple."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        error = pending.pop(0)
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        for kind, reason in _REASONS:
            if isinstance(error, kind):
                return reason
        inner = [a for a in error.args if isinstance(a, BaseException)]
        pending += [*inner, getattr(error, "reason", None), error.__cause__, error.__context__]
    return _short(exc)


def _short(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def require_image(client: docker.DockerClient, image: str) -> None:
    """Raise :class:`SandboxUnavailable` (with the fix) when ``image`` is not on the engine."""
    from docker.errors import ImageNotFound

    try:
        client.api.inspect_image(image)
    except ImageNotFound:
        build = "clover-agent sandbox build" + ("" if image == DEFAULT_SANDBOX_IMAGE else f" --tag {image}")
        raise SandboxUnavailable(
            f"the sandbox image {image} is not on this Docker engine. Build it with `{build}` (no "
            "registry needed; add `--base IMAGE` to build FROM a local image instead of making a "
            "Debian base with debootstrap), or choose another with --image, CLOVER_SANDBOX_IMAGE or "
            f"`[sandbox] image` in .clover/config.toml; {_LOCAL_HINT}"
        ) from None


def stale_containers(client: docker.DockerClient, *, everything: bool = False) -> list[dict[str, Any]]:
    """Labelled sandbox containers whose owner process is gone (all of them with ``everything``)."""
    found = client.api.containers(all=True, filters={"label": f"{LABEL}=1"})
    if everything:
        return found
    stale = []
    for c in found:
        labels = c.get("Labels") or {}
        pid = labels.get(LABEL_OWNER_PID, "")
        if not cleanup.owner_alive(int(pid) if pid.isdigit() else -1, labels.get(LABEL_HOST)):
            stale.append(c)
    return stale


def remove_containers(client: docker.DockerClient, containers: list[dict[str, Any]]) -> list[str]:
    """Force-remove containers (with their anonymous volumes); return the ids removed."""
    from docker.errors import APIError, NotFound

    removed = []
    for c in containers:
        try:
            client.api.remove_container(c["Id"], force=True, v=True)
            removed.append(c["Id"])
        except NotFound:
            pass  # another process reaped it first
        except APIError as exc:
            if exc.status_code != 409:  # 409: another process is removing it right now
                raise
    return removed


class DockerSandbox(SessionSandbox):
    def __init__(self, spec: SandboxSpec) -> None:
        self.spec = spec
        self.run_id = uuid.uuid4().hex[:12]
        self.container_id: str | None = None
        self.image: str | None = None
        self._client: docker.DockerClient | None = None
        self._calls: EngineCalls | None = None  # the client's calls, each with its deadline
        self._socket: Any = None
        self._runner: RunnerSession | None = None  # connected; becomes ``_session`` once ready
        self._cleanup_token: int | None = None
        self._closing = False
        self._sparse: list[SparseFile] = []  # copied in empty; their data goes in once the runner runs

    async def start(self) -> None:
        spec = self.spec
        require_repo(spec)
        if not spec.image:
            raise SandboxConfigError("the Docker sandbox needs an image (SandboxSpec.image; none was given)")
        self._client = client = await asyncio.to_thread(docker_client, spec.host_env)
        self._calls = calls = EngineCalls(client, spec.host_env)
        try:
            await asyncio.to_thread(
                calls, "looking up the sandbox image", QUICK, require_image, client, spec.image, retry=True
            )
            reaped = await asyncio.to_thread(
                calls,
                "removing sandbox containers left by earlier runs",
                SLOW,
                lambda: remove_containers(client, stale_containers(client)),
                retry=True,  # removing again what is gone is a no-op
            )
            if reaped:
                log.info("removed %d sandbox container(s) left by earlier runs", len(reaped))
            plan = await asyncio.to_thread(plan_workspace, spec.repo)
            plan.check_size(spec.limits.disk_bytes)
            self.image = spec.image
            if spec.compiler:
                self.image = await self._compiler_image(spec)
            if spec.environment is not None:
                self.image = await self._environment(spec, plan, self.image)
            # Registered here, on the event loop's thread (normally the main thread, where signal
            # handlers can be installed), before the container exists.
            self._cleanup_token = cleanup.register(self._remove_with_fresh_client)
            if plan.size >= LARGE_COPY_BYTES:
                (spec.progress or _log_progress)(
                    f"copying the repository into the sandbox: {plan.describe()}"
                )
            await self._start_container(spec, plan, self.image, setup=False)
            if spec.environment is not None:
                await self._unpack_overlay()
            await self._run_setup_commands(spec.setup_commands, spec.setup_timeout)
            if spec.setup_commands and spec.setup_network and not spec.network:
                await asyncio.to_thread(self._disconnect_all_networks)
            await self._record_baseline(plan.keep_out)
        except BaseException:
            await self.close()
            raise

    async def _start_container(
        self, spec: SandboxSpec, plan: WorkspacePlan, image: str, *, setup: bool
    ) -> None:
        """A container from ``image`` with the workspace copied in and its runner started."""
        try:
            await asyncio.to_thread(self._create_and_attach, spec, plan, image, setup)
        except DockerException as exc:
            if "no space left on device" in str(exc).lower():
                raise SandboxUnavailable(
                    f"the repository does not fit in the sandbox's disk limit of "
                    f"{spec.limits.disk_bytes / 2**30:.2f} GiB; raise SandboxLimits.disk_bytes"
                ) from None
            raise SandboxUnavailable(
                f"could not start a sandbox container from {image}: {_short(exc)}. The image "
                f"needs python3 and bash; build it with `clover-agent sandbox build` or FROM "
                f"clover-agent-sandbox:latest; {_LOCAL_HINT}"
            ) from None
        assert self._runner is not None
        await asyncio.to_thread(self._runner.start)
        self._session = self._runner
        await self._fill_sparse_files()

    async def _compiler_image(self, spec: SandboxSpec) -> str:
        """The tag of the compiler variant of the spec's image, built first (once) when it is not
        on the engine, with a client of its own: the build may take minutes."""
        assert spec.image is not None
        progress = spec.progress or _log_progress
        client = await asyncio.to_thread(docker_client, spec.host_env)
        built: list[str] = []

        def build_line(line: str) -> None:
            if not built:
                progress(f"compiler: building the compiler variant of {spec.image} (made once)")
            built.append(line)
            if line.startswith("Step "):
                progress(f"  {line.strip()[:160]}")

        try:
            tag, new = await asyncio.to_thread(
                compiler_image, client, spec.image, progress=build_line, host_env=spec.host_env
            )
        finally:
            await asyncio.to_thread(client.close)
        progress(f"compiler: {'built' if new else 'cached'} ({tag})")
        return tag

    async def _environment(self, spec: SandboxSpec, plan: WorkspacePlan, image: str) -> str:
        """The environment image to start from. Without ``spec.compiler``, a set-up that fails
        building an extension for want of a compiler is made once more, by itself, in the image's
        compiler variant (as ``--with-compiler`` does), and that environment is found in the cache
        the next time; a set-up that fails there too says both were tried."""
        if spec.compiler:
            return await self._environment_image(spec, plan, image)
        progress = spec.progress or _log_progress
        cached = await self._in_compiler_variant(spec, image)
        if cached is not None:
            progress(
                f"environment: cached, in the compiler variant (its set-up builds an extension: {cached})"
            )
            return cached
        try:
            return await self._environment_image(spec, plan, image)
        except SandboxSetupError as exc:
            if not exc.native_build:
                raise
        progress(
            "environment: an extension could not be built without a compiler; setting up once more in the "
            "image's compiler variant (as --with-compiler does; cached like any environment)"
        )
        compiled = dataclasses.replace(spec, compiler=True)
        try:
            return await self._environment_image(compiled, plan, await self._compiler_image(compiled))
        except SandboxSetupError as exc:
            raise SandboxSetupError(
                f"{exc.message}\n(Tried without a compiler, then by itself in the image's compiler variant: "
                "what `--with-compiler` or `compiler = true` in .clover/config.toml's [sandbox] table gives.)"
            ) from None

    async def _in_compiler_variant(self, spec: SandboxSpec, image: str) -> str | None:
        """The environment image made earlier in ``image``'s compiler variant (a set-up that needed
        a compiler), when both are on the engine; else None."""
        assert self._client is not None and self._calls is not None and spec.environment is not None
        client, calls = self._client, self._calls
        inspected = await asyncio.to_thread(
            calls, "inspecting the sandbox image", QUICK, client.api.inspect_image, image, retry=True
        )
        variant = compiler_tag(inspected["Id"])
        if not await asyncio.to_thread(
            calls, "looking up the compiler variant", QUICK, _image_present, client, variant, retry=True
        ):
            return None
        variant_id = (
            await asyncio.to_thread(calls, "inspecting it", QUICK, client.api.inspect_image, variant)
        )["Id"]
        tag = env_image.environment_tag(spec.environment, variant_id)
        present = await asyncio.to_thread(
            calls, "looking up the environment image", QUICK, _image_present, client, tag, retry=True
        )
        return tag if present else None

    async def _environment_image(self, spec: SandboxSpec, plan: WorkspacePlan, image: str) -> str:
        """The tag of the spec's environment image over ``image``, made first by a set-up
        container when it is not on the engine (see :mod:`clover_agent.sandboxes.env_image`)."""
        assert self._client is not None and spec.environment is not None
        client, recipe, progress = self._client, spec.environment, spec.progress or _log_progress
        assert self._calls is not None
        calls = self._calls
        inspected = await asyncio.to_thread(
            calls, "inspecting the sandbox image", QUICK, client.api.inspect_image, image, retry=True
        )
        base_id = inspected["Id"]
        tag = env_image.environment_tag(recipe, base_id)
        if await asyncio.to_thread(
            calls, "looking up the environment image", QUICK, _image_present, client, tag, retry=True
        ):
            progress(f"environment: cached ({tag})")
            return tag
        progress(f"environment: setting the project up in a new environment ({tag}, made once)")
        builder = DockerSandbox(spec)
        builder._client = await asyncio.to_thread(docker_client, spec.host_env)  # its own: closed with it
        builder._calls = EngineCalls(builder._client, spec.host_env)
        builder._cleanup_token = cleanup.register(builder._remove_with_fresh_client)
        try:
            await builder._start_container(spec, plan, image, setup=True)
            await env_image.run_setup(builder, recipe, progress, compiler=spec.compiler)
            assert builder.container_id is not None
            changes = env_image.commit_changes(str(Path(spec.repo).resolve()), base_id)
            repository, _, name = tag.partition(":")
            await asyncio.to_thread(
                calls,
                "saving the environment image",
                SLOW,
                client.api.commit,
                builder.container_id,
                repository=repository,
                tag=name,
                changes=changes,
            )
        finally:
            await builder.close()
        return tag

    async def _unpack_overlay(self) -> None:
        """Put the files the environment's set-up made in ``/workspace`` into this fresh copy,
        keeping every file the copy already has."""
        result = await self.exec(
            f"[ ! -s {WORKSPACE_OVERLAY} ] || tar -xf {WORKSPACE_OVERLAY} -C {WORKSPACE} --skip-old-files",
            timeout=300,
        )
        if result.exit_code != 0:
            raise SandboxError(
                f"could not unpack the environment's workspace files:\n{result.output[-2000:]}"
            )

    def _create_and_attach(self, spec: SandboxSpec, plan: WorkspacePlan, image: str, setup: bool) -> None:
        """Create and start the container from ``image`` and copy the workspace in. ``setup``: an
        environment's set-up container (writable root file system, the recipe's network, its inputs
        in a volume at SETUP_DIR) instead of the sandbox itself."""
        assert self._client is not None and self._calls is not None
        api, calls = self._client.api, self._calls
        limits = spec.limits
        if setup:
            assert spec.environment is not None
            networked = spec.environment.network
        else:
            networked = spec.network or (spec.setup_network and bool(spec.setup_commands))
        from docker.types import DriverConfig, Mount

        workspace = Mount(
            target=WORKSPACE,
            source=None,  # an anonymous volume: removed with the container
            type="volume",
            driver_config=DriverConfig(
                "local",
                {
                    "type": "tmpfs",
                    "device": "tmpfs",
                    "o": f"size={limits.disk_bytes},uid={SANDBOX_UID},gid={SANDBOX_GID},mode=0755,nosuid,nodev",
                },
            ),
        )
        # The set-up's inputs: an anonymous volume too, so they are never part of the committed image.
        mounts = [workspace, Mount(target=SETUP_DIR, source=None, type="volume")] if setup else [workspace]
        host_config = api.create_host_config(
            mounts=mounts,
            network_mode="bridge" if networked else "none",
            read_only=not setup,
            tmpfs={"/tmp": f"rw,exec,nosuid,nodev,size={TMP_SIZE}"},
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            mem_limit=limits.memory_bytes,
            memswap_limit=limits.memory_bytes,  # no swap: over the limit means killed, not slow
            nano_cpus=int(limits.cpus * 1e9),
            pids_limit=limits.pids,
            init=True,
        )
        env = {"HOME": "/tmp", "WORKSPACE": WORKSPACE, "LANG": "C.UTF-8", **spec.env}
        # A create that times out may still make the container: close() finds it by its run id.
        container = calls(
            "creating the sandbox container",
            SLOW,
            api.create_container,
            image,
            command=runner_command("python3", WORKSPACE, "container"),
            user=f"{SANDBOX_UID}:{SANDBOX_GID}",
            working_dir=WORKSPACE,
            environment=env,
            stdin_open=True,
            tty=False,
            labels={
                LABEL: "1",
                LABEL_OWNER_PID: str(os.getpid()),
                LABEL_HOST: cleanup.HOST_ID,
                LABEL_RUN_ID: self.run_id,
            },
            host_config=host_config,
        )
        self.container_id = container["Id"]
        self._socket = api.attach_socket(
            self.container_id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
        )
        session = RunnerSession(self._send, on_lost=self._explain_loss)
        threading.Thread(target=_pump_frames, args=(self._socket, session), daemon=True).start()
        self._runner = session
        # The workspace goes in before the runner is told to start, so its first command sees it.
        with tempfile.TemporaryFile() as archive:
            self._sparse = write_workspace_tar(plan, archive, uid=SANDBOX_UID, gid=SANDBOX_GID)
            archive.seek(0)
            calls("starting the sandbox container", SLOW, api.start, self.container_id)
            calls(
                "copying the repository into the sandbox",
                SLOW,
                api.put_archive,
                self.container_id,
                WORKSPACE,
                archive,
            )
        if setup:
            assert spec.environment is not None
            inputs = env_image.setup_inputs_tar(spec.environment, uid=SANDBOX_UID, gid=SANDBOX_GID)
            calls(
                "copying the set-up's inputs in", SLOW, api.put_archive, self.container_id, SETUP_DIR, inputs
            )

    async def _fill_sparse_files(self) -> None:
        """Write the data of the sparse files (copied in empty) at their offsets, holes left out."""
        assert self._runner is not None
        for sparse in self._sparse:
            path = f"{WORKSPACE}/{sparse.rel}"
            await self._runner.write_at(path, 0, b"", size=sparse.size, mode=sparse.mode)
            for start, length in sparse.segments:
                for offset, data in read_segment(sparse.path, start, length, WRITE_CHUNK_BYTES):
                    await self._runner.write_at(path, offset, data, size=None, mode=sparse.mode)
        self._sparse = []

    def _send(self, data: bytes) -> None:
        sock = self._socket
        raw = getattr(sock, "_sock", sock)
        if hasattr(raw, "sendall"):
            raw.sendall(data)
        else:  # paramiko channels (ssh://) and other socket-likes
            view = memoryview(data)
            while view:
                view = view[raw.send(view) :]

    def _disconnect_all_networks(self) -> None:
        assert self._client is not None and self._calls is not None and self.container_id is not None
        api, calls = self._client.api, self._calls
        inspected = calls(
            "inspecting the sandbox container", QUICK, api.inspect_container, self.container_id, retry=True
        )
        for name in inspected["NetworkSettings"]["Networks"] or {}:
            calls(
                "disconnecting the sandbox from the network",
                SLOW,
                api.disconnect_container_from_network,
                self.container_id,
                name,
                force=True,
            )

    def _explain_loss(self) -> str:
        """Why the runner's stream ended: closed by us, or what happened to the container."""
        if self._closing or self._client is None or self.container_id is None:
            return "the sandbox was closed"
        try:
            state = self._client.api.inspect_container(self.container_id)["State"]
        except Exception as exc:
            return f"the sandbox container is gone ({exc})"
        if state.get("OOMKilled"):
            return "the sandbox container was killed: out of memory (its runner exceeded the memory limit)"
        return (
            f"the sandbox container stopped (status {state.get('Status')}, exit code {state.get('ExitCode')})"
        )

    def attached(self, argv: list[str], env: dict[str, str] | None = None) -> Attached:
        """``docker exec -i`` into the container, as the sandbox's user in the workspace (the docker
        command line on this machine, at the engine the sandbox uses)."""
        if self.container_id is None:
            raise SandboxError("the Docker sandbox is not started")
        docker_cli = shutil.which("docker")
        if docker_cli is None:
            raise SandboxError(
                "running a program attached to the Docker sandbox needs the `docker` command line, "
                "which is not on PATH"
            )
        variables = [f"--env={name}={value}" for name, value in (env or {}).items()]
        exec_argv = [docker_cli, "exec", "--interactive", f"--user={SANDBOX_UID}:{SANDBOX_GID}"]
        return Attached(
            [*exec_argv, f"--workdir={WORKSPACE}", *variables, self.container_id, *argv],
            None,
            dict(self.spec.host_env),
        )

    async def close(self) -> None:
        await asyncio.to_thread(self._close_now)

    def _close_now(self) -> None:
        """Remove the container and its volume. Idempotent."""
        self._closing = True
        self._session = self._runner = None
        self.base_commit = None
        if self._cleanup_token is not None:
            cleanup.unregister(self._cleanup_token)
            self._cleanup_token = None
        container_id, self.container_id = self.container_id, None
        sock, self._socket = self._socket, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass
        client, self._client = self._client, None
        calls, self._calls = self._calls, None
        if client is None or calls is None:
            return
        try:
            self._remove_own_containers(calls, container_id)
        finally:
            client.close()  # its pooled HTTP connections to the engine

    def _remove_own_containers(self, calls: EngineCalls, container_id: str | None) -> None:
        """Remove this sandbox's container: by id, or, when its creation got no answer (the engine
        may have made it all the same), by this sandbox's run-id label. Says which container may be
        left when the engine does not answer."""
        client = calls.client
        try:
            if container_id is None:
                containers = calls(
                    "looking for the sandbox container",
                    QUICK,
                    client.api.containers,
                    all=True,
                    filters={"label": f"{LABEL_RUN_ID}={self.run_id}"},
                    retry=True,
                )
            else:
                containers = [{"Id": container_id}]
            if containers:
                calls(
                    "removing the sandbox container", SLOW, remove_containers, client, containers, retry=True
                )
        except (SandboxUnavailable, DockerException) as exc:
            why = exc.message if isinstance(exc, SandboxUnavailable) else f"the Docker engine: {_short(exc)}"
            which = container_id[:12] if container_id else f"labelled {LABEL_RUN_ID}={self.run_id}"
            raise SandboxUnavailable(
                f"{why}. The sandbox container ({which}) may be left: `clover-agent sandbox prune` "
                "removes it once the engine answers"
            ) from None

    def _remove_with_fresh_client(self) -> None:
        """Cleanup for signal handlers and exit: a new client, since the signal may have interrupted
        a request on the shared one."""
        self._closing = True
        client = docker_client(self.spec.host_env)
        try:
            self._remove_own_containers(EngineCalls(client, self.spec.host_env), self.container_id)
        finally:
            client.close()


def _image_present(client: docker.DockerClient, tag: str) -> bool:
    from docker.errors import ImageNotFound

    try:
        client.api.inspect_image(tag)
    except ImageNotFound:
        return False
    return True


def _log_progress(message: str) -> None:
    log.info("%s", message)


def _pump_frames(sock: Any, session: RunnerSession) -> None:
    """Reader thread: split Docker's multiplexed attach stream into the runner's stdout and stderr."""
    from docker.utils.socket import frames_iter

    try:
        for stream, data in frames_iter(sock, tty=False):
            if stream == 1:
                session.feed(data)
            elif stream == 2:
                session.feed_stderr(data)
    except (OSError, ValueError):
        pass  # the socket was closed under us: the container is being removed
    finally:
        session.feed_eof()
