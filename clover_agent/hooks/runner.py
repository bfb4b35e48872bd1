"""The hooks of one session, run on its events: :class:`Hooks`.

Each event's hooks run one after another, in the order the files list them (the user's settings,
then a trusted repository's), with Claude Code's JSON on stdin. Exit 0 is success (stdout read as
JSON when it is JSON), exit 2 blocks (stderr is the reason), any other exit, a timeout or output
that looks like JSON but is not is a failure that is named (a :class:`HookRan` event) and never
changes the outcome. A deny ends the event's run: later hooks do not see the call.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clover_agent.events import EventBus, HookRan
from clover_agent.hooks.config import HookConfig
from clover_agent.hooks.outcome import REASON_CHARS, HookRun, judge, legacy, reason_of
from clover_agent.hooks.process import Finished, run_command
from clover_agent.hooks.tool_input import aliases, from_hook, hook_view
from clover_agent.safe_text import terminal_safe
from clover_agent.sandboxes.base import WORKSPACE, Sandbox, SandboxError

#: Characters of a hook's output kept in its event.
TAIL_CHARS = 2000
#: Times in a row a Stop hook may send the agent back to work before its block is ignored.
MAX_SENDS_BACK = 3
#: Bytes of the patch a PreHandBack hook is given (the files are listed whole).
PATCH_BYTES = 256 * 1024
#: Variables a host hook gets from this process's environment (nothing else of it).
_PASSED = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR",
           "DISPLAY", "WAYLAND_DISPLAY", "DBUS_SESSION_BUS_ADDRESS", "XDG_RUNTIME_DIR")  # fmt: skip


@dataclass(frozen=True)
class ToolVerdict:
    """What the PreToolUse hooks said of a call: ``deny`` (the reason the model reads), ``ask``
    (a person is asked, as if the policy said so), the ``arguments`` to run instead (None: as
    called), and ``context`` for the model."""

    deny: str | None = None
    ask: str | None = None
    arguments: dict[str, Any] | None = None
    context: str = ""


@dataclass(frozen=True)
class StopVerdict:
    """What the Stop hooks said: ``send_back`` is the message the agent goes on with (None: stop)."""

    send_back: str | None = None


@dataclass(frozen=True)
class PromptVerdict:
    """What the UserPromptSubmit hooks said: ``blocked`` is why the request does not reach the model
    (None: it does), ``context`` words the model reads with it."""

    blocked: str | None = None
    context: str = ""


class Hooks:
    """The hooks of one session (see the module docstring), reported on ``bus``.

    - ``repo``: the user's repository (host hooks run there); ``transcript``: the session's
      trajectory file (``transcript_path``).
    - ``environ``: this process's environment, of which host hooks get :data:`_PASSED`.
    - ``sandbox``: where ``where = "sandbox"`` hooks run (set once it is started).
    """

    def __init__(
        self,
        configs: Sequence[HookConfig],
        bus: EventBus,
        *,
        session_id: str,
        repo: Path,
        transcript: Path,
        environ: Mapping[str, str] | None = None,
        sandbox: Sandbox | None = None,
    ) -> None:
        self.configs = tuple(configs)
        self.bus = bus
        self.session_id = session_id
        self.repo = repo
        self.transcript = transcript
        self.environ = dict(os.environ if environ is None else environ)
        self.sandbox = sandbox
        self.sends_back = 0  # Stop hooks' sends back in a row (reset by a stop that is let through)

    def any(self, event: str) -> bool:
        """Whether a hook is bound to ``event``."""
        return any(h.event == event for h in self.configs)

    # -- the events ----------------------------------------------------------------------------------

    async def pre_tool_use(self, call_id: str, name: str, arguments: dict[str, Any]) -> ToolVerdict:
        """Run the PreToolUse hooks matching the call; each sees the arguments as the ones before
        it left them."""
        current: dict[str, Any] | None = None
        ask, contexts = None, []
        for hook in self._hooks("PreToolUse"):
            if not hook.matches(aliases(name, current or arguments)):  # as the hooks before left it
                continue
            run = await self._run(hook, self._tool_payload(hook, call_id, name, current or arguments))
            spec = run.specific
            decision = spec.get("permissionDecision") or legacy(run.output.get("decision"))
            why = reason_of(str(spec.get("permissionDecisionReason") or run.output.get("reason") or ""))
            deny = run.blocked or (
                (why or f"denied by {hook.describe()}") if not run.failure and decision == "deny" else None
            )
            updated = spec.get("updatedInput") if not run.failure else None
            context = reason_of(str(spec.get("additionalContext") or "")) if not run.failure else ""
            if deny is not None:
                self._report(run, call_id, name, "deny", deny)
                return ToolVerdict(deny=deny)
            decided, said = "ok", why
            if decision == "ask":
                ask, decided = why or f"{hook.describe()} asks for a person's approval", "ask"
            if isinstance(updated, dict):
                current = from_hook(name, current or arguments, updated, self._roots())
                decided = "modify" if decided == "ok" else decided
                shown = json.dumps(current, ensure_ascii=False, default=str)
                said = said or f"changed the arguments to {shown[:REASON_CHARS]}"
            if context:
                contexts.append(context)
                decided = "context" if decided == "ok" else decided
            self._report(run, call_id, name, decided, said)
        return ToolVerdict(ask=ask, arguments=current, context="\n".join(contexts))

    async def post_tool_use(
        self, call_id: str, name: str, arguments: dict[str, Any], output: str, ok: bool
    ) -> str:
        """Run the PostToolUse hooks matching the call; returns what they give the model to read
        with the result (an exit 2's stderr, a ``block``'s reason, ``additionalContext``)."""
        said = []
        for hook in self._matching("PostToolUse", name, arguments):
            payload = self._tool_payload(hook, call_id, name, arguments)
            payload["tool_response"] = {"output": output, "success": ok, "is_error": not ok}
            run = await self._run(hook, payload)
            text = run.blocked
            if text is None and not run.failure:
                block = legacy(run.output.get("decision")) == "deny"
                text = reason_of(str(run.output.get("reason") or "")) if block else None
                text = "\n".join(
                    t for t in (text, reason_of(str(run.specific.get("additionalContext") or ""))) if t
                )
            self._report(run, call_id, name, "context" if text else "ok", text or "")
            if text:
                said.append(text)
        return "\n".join(said)

    async def stop(self, outcome: str, summary: str) -> StopVerdict:
        """Run the Stop hooks as the agent would stop (``outcome``: submitted or answered); a block
        sends it back to work, at most :data:`MAX_SENDS_BACK` times in a row."""
        if not self.any("Stop"):
            return StopVerdict()
        reasons = []
        for hook in self._hooks("Stop"):
            payload = self._payload(hook, "Stop")
            payload |= {"stop_hook_active": self.sends_back > 0, "outcome": outcome, "summary": summary}
            run = await self._run(hook, payload)
            reason = run.blocked
            if (
                reason is None
                and not run.failure
                and run.output.get("continue") is not False
                and legacy(run.output.get("decision")) == "deny"
            ):
                reason = reason_of(str(run.output.get("reason") or "")) or f"sent back by {hook.describe()}"
            if reason is not None and self.sends_back >= MAX_SENDS_BACK:
                self._report(run, decided="ok", reason=f"ignored: it sent the agent back {MAX_SENDS_BACK} "
                             f"times in a row already ({reason})")  # fmt: skip
                continue
            self._report(run, decided="block" if reason else "ok", reason=reason or "")
            if reason:
                reasons.append(reason)
        if not reasons:
            self.sends_back = 0
            return StopVerdict()
        self.sends_back += 1
        return StopVerdict("\n".join(reasons))

    async def user_prompt_submit(self, prompt: str) -> PromptVerdict:
        """Run the UserPromptSubmit hooks on a person's request before the model reads it: a block
        (exit 2, ``decision: "block"``, ``continue: false``) keeps it from the model, its reason shown
        to the person; on exit 0, ``additionalContext`` (or plain stdout) is context for the model."""
        found: list[str] = []
        for hook in self._hooks("UserPromptSubmit"):
            run = await self._run(hook, self._payload(hook, "UserPromptSubmit") | {"prompt": prompt})
            blocked = run.blocked
            if blocked is None and not run.failure and run.output.get("continue") is False:
                blocked = (
                    reason_of(str(run.output.get("stopReason") or "")) or f"stopped by {hook.describe()}"
                )
            if blocked is None and not run.failure and legacy(run.output.get("decision")) == "deny":
                blocked = reason_of(str(run.output.get("reason") or "")) or f"blocked by {hook.describe()}"
            text = ""
            if blocked is None and not run.failure and run.finished.exit_code == 0:
                plain = run.finished.stdout if not run.output else ""
                text = reason_of(str(run.specific.get("additionalContext") or plain))
            self._report(
                run, decided="block" if blocked else "context" if text else "ok", reason=blocked or text[:200]
            )
            if blocked:
                named = hook.describe() in blocked  # a hook that gave no reason is named already
                return PromptVerdict(blocked if named else f"{blocked} (blocked by {hook.describe()})")
            if text:
                found.append(text)
        return PromptVerdict(context="\n".join(found))

    async def pre_hand_back(self, files: list[str], patch: bytes, verdict: str) -> str | None:
        """Run the PreHandBack hooks before a patch is written into the user's tree; returns the
        reason of a veto (None: it may be applied)."""
        for hook in self._hooks("PreHandBack"):
            payload = self._payload(hook, "PreHandBack")
            payload |= {
                "files": files,
                "verdict": verdict,
                "patch": patch[:PATCH_BYTES].decode("utf-8", "replace"),
                "patch_truncated": len(patch) > PATCH_BYTES,
            }
            run = await self._run(hook, payload)
            veto = run.blocked
            if veto is None and not run.failure:
                decision = run.specific.get("permissionDecision") or legacy(run.output.get("decision"))
                if decision == "deny":
                    veto = reason_of(
                        str(run.specific.get("permissionDecisionReason") or run.output.get("reason") or "")
                    )
                    veto = veto or f"vetoed by {hook.describe()}"
            self._report(run, decided="veto" if veto else "ok", reason=veto or "")
            if veto:
                return f"{veto} (vetoed by {hook.describe()})"
        return None

    async def session_start(self, source: str) -> str:
        """Run the SessionStart hooks (``source``: startup or resume); returns the context they
        add for the model (``additionalContext``, or plain stdout)."""
        found = []
        for hook in self._matching_word("SessionStart", source):
            run = await self._run(hook, self._payload(hook, "SessionStart") | {"source": source})
            text = ""
            if not run.failure and run.finished.exit_code == 0:
                plain = run.finished.stdout if not run.output else ""
                text = reason_of(str(run.specific.get("additionalContext") or plain))
            self._report(run, decided="context" if text else "ok", reason=text[:200])
            if text:
                found.append(text)
        return "\n".join(found)

    async def session_end(self, reason: str) -> None:
        """Run the SessionEnd hooks (nothing they say changes anything)."""
        for hook in self._matching_word("SessionEnd", reason):
            self._report(await self._run(hook, self._payload(hook, "SessionEnd") | {"reason": reason}))

    # -- running one -----------------------------------------------------------------------------

    def _hooks(self, event: str) -> list[HookConfig]:
        return [h for h in self.configs if h.event == event]

    def _matching_word(self, event: str, word: str) -> list[HookConfig]:
        """The hooks of ``event`` whose matcher takes ``word`` (SessionStart's source, SessionEnd's reason)."""
        return [h for h in self._hooks(event) if h.matches((word,))]

    def _matching(self, event: str, name: str, arguments: Mapping[str, Any]) -> list[HookConfig]:
        names = aliases(name, arguments)
        return [h for h in self._hooks(event) if h.matches(names)]

    def _root(self, hook: HookConfig) -> str:
        """Where the workspace's files are for ``hook``."""
        return str(self.repo) if hook.where == "host" else self._sandbox_root()

    def _sandbox_root(self) -> str:
        """The workspace as a sandbox hook sees it (the local sandbox's copy is a host folder)."""
        if self.sandbox is not None:
            try:
                return self.sandbox.attached(["true"]).cwd or WORKSPACE
            except SandboxError:
                pass
        return WORKSPACE

    def _roots(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((str(self.repo), self._sandbox_root())))

    def _payload(self, hook: HookConfig, event: str) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "transcript_path": str(self.transcript),
            "cwd": self._root(hook),
            "hook_event_name": event,
            "clover": {"repo": str(self.repo), "where": hook.where, "workspace": WORKSPACE},
        }

    def _tool_payload(
        self, hook: HookConfig, call_id: str, name: str, arguments: Mapping[str, Any]
    ) -> dict[str, Any]:
        return self._payload(hook, hook.event) | {
            "tool_name": name,
            "tool_aliases": list(aliases(name, arguments)[1:]),
            "tool_use_id": call_id,
            "tool_input": hook_view(name, arguments, self._root(hook)),
        }

    async def _run(self, hook: HookConfig, payload: dict[str, Any]) -> HookRun:
        data = json.dumps(payload, ensure_ascii=False, default=str).encode("utf-8", "backslashreplace")
        try:
            argv, cwd, env = self._command(hook)
        except SandboxError as exc:
            return HookRun(hook, Finished(None, "", "", 0.0, error=f"the sandbox cannot run it: {exc}"),
                        failure=f"the sandbox cannot run it: {exc}")  # fmt: skip
        finished = await run_command(argv, data, cwd=cwd, env=env, timeout_s=hook.timeout_s)
        return judge(hook, finished)

    def _command(self, hook: HookConfig) -> tuple[list[str], str | None, dict[str, str]]:
        if hook.where == "sandbox":
            if self.sandbox is None:
                raise SandboxError("no sandbox is running")
            attached = self.sandbox.attached(
                ["bash", "-c", hook.command],
                {"CLOVER_PROJECT_DIR": WORKSPACE, "CLAUDE_PROJECT_DIR": WORKSPACE},
            )
            return attached.argv, attached.cwd, attached.env
        env = {k: self.environ[k] for k in _PASSED if k in self.environ}
        env |= {"CLOVER_PROJECT_DIR": str(self.repo), "CLAUDE_PROJECT_DIR": str(self.repo)}
        return ["/bin/sh", "-c", hook.command], str(self.repo), env

    def _report(
        self, run: HookRun, call_id: str = "", tool: str = "", decided: str = "ok", reason: str = ""
    ) -> None:
        finished = run.finished
        tail = finished.stderr + ("\n" if finished.stderr and finished.stdout else "") + finished.stdout
        tail = tail[-TAIL_CHARS:] + (
            f"\n[{finished.dropped} more bytes not kept]" if finished.dropped else ""
        )
        self.bus.emit(
            HookRan(
                hook_event=run.hook.event,
                command=run.hook.command,
                origin=run.hook.origin,
                where=run.hook.where,
                exit_code=finished.exit_code,
                duration_s=finished.duration_s,
                decided="failed" if run.failure else decided,
                failed=bool(run.failure),
                timed_out=finished.timed_out,
                reason=run.failure or reason,
                output_tail=terminal_safe(tail),
                call_id=call_id,
                tool=tool,
            )
        )
