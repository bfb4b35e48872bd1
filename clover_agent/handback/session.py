"""An interactive session's hand-back (the TUI's ``/apply``, ACP's offer), judged as ``fix`` judges.

The host takes stock of the workspace when the sandbox starts (:class:`~clover_agent.handback.stock.Stock`).
:meth:`SessionHandBack.offer` stops the sandbox's processes and reads what changed into the host's
shadow repository (what is never handed back left out): nothing is diffed inside the sandbox. The
patch is then judged by :func:`~clover_agent.handback.judging.check_patch`, held out and with every
check of how tests pass, against a baseline made in a fresh sandbox exactly the session's start:
the tests failing there are the target; when none fails, the request alone said what to do and a
test the patch adds or changes must fail without it. A part of the offer chosen file by file is
judged again on its own (:meth:`SessionHandBack.part`) before it can be applied, so the verdict
shown always describes the bytes written. Applied (the verified bytes, all or nothing), the offer's
tree is the start of the next one: what was not applied is offered again with later work.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from clover_agent.errors import ExitCode
from clover_agent.events import EventBus
from clover_agent.handback.apply import Applied, PatchNotApplied, apply_patch_set, blob_id
from clover_agent.handback.judging import WORKERS, Checked, Judging, check_patch, target_for
from clover_agent.handback.patches import changed_files
from clover_agent.handback.shadow import REGULAR
from clover_agent.handback.stock import PatchSet, Stock
from clover_agent.handback.verdict import Judgement, Verdict
from clover_agent.hooks import Hooks
from clover_agent.sandboxes.base import Sandbox, SandboxSpec
from clover_agent.sandboxes.factory import create_sandbox
from clover_agent.tools.run_tests import DEFAULT_TIMEOUT_S, TestReport, default_test_timeout, run_tests_in

#: Writes one file through the editor: (absolute path, text).
WriteText = Callable[[str, str], Awaitable[None]]


@dataclass(frozen=True)
class FileChange:
    """One file of an offer, as a person reviews it: its part of the patch and its counts."""

    path: str
    patch: str  # the git diff section for this file
    status: str  # added | deleted | modified | ...
    added: int = 0
    removed: int = 0
    applied_before: bool = False  # an earlier apply of the session wrote this file


@dataclass
class Offer:
    """What is offered: the patch (host side), its judgement, and each file's two texts."""

    patch: PatchSet
    checked: Checked
    texts: dict[str, tuple[str | None, str | None]]  # path -> (old, new); None: absent or not text
    applied_before: frozenset[str] = frozenset()

    @property
    def judged(self) -> Judgement:
        return self.checked.judged

    @property
    def verdict(self) -> str:
        """The verdict's words, as ``fix`` says them: ``<verdict>: <message>``."""
        word, message = str(self.judged.verdict), self.judged.message
        return message if message.startswith(f"{word}:") else f"{word}: {message}"

    @property
    def review(self) -> list[str]:
        """What the checks of how the tests pass found (``needs review``'s findings)."""
        return list(self.judged.review)

    @property
    def files(self) -> list[FileChange]:
        """Each changed file's part of the patch, in order."""
        parts = sections(self.patch.patch.decode("utf-8", "replace"))
        found = []
        for change in self.patch.changes:
            section = parts.get(change.path, "")
            lines = section.splitlines()
            added = sum(1 for line in lines if line.startswith("+") and not line.startswith("+++"))
            removed = sum(1 for line in lines if line.startswith("-") and not line.startswith("---"))
            found.append(
                FileChange(
                    change.path, section, change.status, added, removed, change.path in self.applied_before
                )
            )
        return found

    @property
    def as_text(self) -> bool:
        """Whether every change can go through ``fs/write_text_file`` (a text file added or edited)."""
        return all(
            c.status in ("added", "modified")
            and c.new_mode == REGULAR
            and c.old_mode in (0, REGULAR)
            and self.texts.get(c.path, (None, None))[1] is not None
            for c in self.patch.changes
        )


def sections(patch: str) -> dict[str, str]:
    """A git patch's part for each file, by its (new) path."""
    parts: dict[str, str] = {}
    for section in re.split(r"(?m)^(?=diff --git )", patch):
        names = changed_files(section)
        if names:
            parts[names[-1]] = section
    return parts


def _text(data: bytes | None) -> str | None:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


@dataclass
class _Baseline:
    """The runs on the session's start: the suite, and the tests failing in it run alone."""

    suite: TestReport
    target: str = ""
    target_report: TestReport | None = None


@dataclass
class SessionHandBack:
    """One session's hand-back (see the module docstring); ``folder`` holds its shadow repository.

    - ``sandbox``: the session's sandbox (the agent works there); ``kind``, ``spec``: how fresh
      ones are made for the judging runs.
    - ``repo``: the user's tree; ``bus``: where the judging runs are reported (``TestsRun``).
    - ``hooks``: the session's hooks, whose PreHandBack hooks may veto an apply.
    """

    sandbox: Sandbox
    kind: str
    spec: SandboxSpec
    repo: Path
    folder: Path
    bus: EventBus = field(default_factory=EventBus)
    suite_timeout_s: float = DEFAULT_TIMEOUT_S
    hooks: Hooks | None = None
    stock: Stock = field(init=False)
    #: Paths an apply of this session wrote (their uncommitted change in the tree is ours).
    applied: set[str] = field(default_factory=set)
    _baselines: dict[str, _Baseline] = field(default_factory=dict)
    _judged: dict[tuple[str, str], Checked] = field(default_factory=dict)  # (base, patch digest) -> verdict

    def __post_init__(self) -> None:
        self.stock = Stock(self.folder, self.repo)

    async def start(self) -> None:
        """Take stock of the workspace as it is now: what a later offer is the change from (call
        once the sandbox started, before any change)."""
        await self.stock.record_start(self.sandbox)

    async def offer(self) -> Offer | None:
        """The changes since the start (or the last apply), judged; None: no change. Every process
        in the session's sandbox is stopped first, so nothing changes the workspace as it is read."""
        patch = await self.stock.record_end(self.sandbox)
        if not patch.changes:
            return None
        return await self._offer(patch)

    async def diff(self) -> str:
        """The patch an offer would hold now, read on the host without stopping anything (a look,
        not a hand-back: nothing is judged)."""
        patch = await self.stock.record_end(self.sandbox, stop=False)
        return patch.patch.decode("utf-8", "replace")

    async def pending(self) -> list[str]:
        """The files an offer would hold now (a look, as :meth:`diff`): what quitting leaves behind.
        None of them before :meth:`start` has recorded the start (quitting that early: nothing to name)."""
        if self.stock.base is None:
            return []
        return (await self.stock.record_end(self.sandbox, stop=False)).files

    async def part(self, offer: Offer, paths: list[str]) -> Offer:
        """The files ``paths`` of ``offer`` alone, as a patch of their own, judged again on their own
        (held out, in a fresh sandbox): what is offered when a person leaves files out."""
        if set(paths) == set(offer.patch.files):
            return offer
        return await self._offer(self.stock.subset(offer.patch, paths))

    async def _offer(self, patch: PatchSet) -> Offer:
        shadow = self.stock.shadow
        before, after = shadow.files(patch.base), shadow.files(patch.final)
        wanted = {f"a/{c.path}": before[c.path][1] for c in patch.changes if c.path in before}
        wanted |= {f"b/{c.path}": after[c.path][1] for c in patch.changes if c.path in after}
        blobs = await asyncio.to_thread(shadow.blobs, wanted)
        texts = {
            c.path: (_text(blobs.get(f"a/{c.path}")), _text(blobs.get(f"b/{c.path}"))) for c in patch.changes
        }
        checked = await self.judge(patch)
        return Offer(patch, checked, texts, frozenset(self.applied & set(patch.files)))

    async def judge(self, patch: PatchSet) -> Checked:
        """The verdict on ``patch`` as ``fix`` gives it (see the module docstring); the same bytes
        from the same start are judged once."""
        key = (patch.base, hashlib.sha256(patch.patch).hexdigest())
        if key not in self._judged:
            self._judged[key] = await self._judge(patch)
        return self._judged[key]

    async def _judge(self, patch: PatchSet) -> Checked:
        baseline = await self._baseline(patch.base)
        suite = baseline.suite
        if suite.timed_out or (suite.problem and not suite.outcomes) or not suite.outcomes:
            why = (suite.problem or suite.summary()) if suite.outcomes or suite.problem else "no tests found"
            return Checked(
                Judgement(
                    Verdict.NOT_FIXED,
                    ExitCode.FAILURE,
                    f"not verified: the suite could not be run on the session's start ({why}); a change is "
                    "checked with the tests",
                )
            )
        judging = Judging(
            self.spec,
            self.kind,
            self.stock,
            suite,
            baseline.target,
            baseline.target_report,
            suite_timeout_s=self.suite_timeout_s,
        )
        return await check_patch(judging, patch, self.bus)

    async def _baseline(self, base: str) -> _Baseline:
        """The runs before the change, made once per start in a fresh sandbox exactly that start."""
        found = self._baselines.get(base)
        if found is not None:
            return found
        test_timeout = default_test_timeout(self.suite_timeout_s)
        async with create_sandbox(self.kind, self.spec) as fresh:
            await self.stock.make_like(fresh, base)
            suite = await run_tests_in(
                fresh, None, timeout=self.suite_timeout_s, workers=WORKERS, test_timeout=test_timeout
            )
            failing = [t for t, o in suite.outcomes.items() if o in ("failed", "error")]
            found = _Baseline(suite)
            if failing:
                found.target = target_for(failing)
                found.target_report = await run_tests_in(fresh, found.target, test_timeout=test_timeout)
        self._baselines[base] = found
        return found

    async def _take_back(
        self, offer: Offer, written: list[str], write_text: WriteText, made: dict[str, list[Path]]
    ) -> str:
        """Put back, last first, the files of ``offer`` the editor wrote before a write failed (a
        file that no longer holds what was written is the user's since: kept; ``made``: the folders
        each path lacked before, removed again when empty); what was done, for the failure's message."""
        if not written:
            return "nothing was written"
        put: list[str] = []
        kept: list[str] = []
        left: list[str] = []
        for path in reversed(written):
            old, new = offer.texts[path]
            assert new is not None
            try:
                back = await _put_back(self.repo, path, old, new, write_text, made.get(path, []))
                (put if back else kept).append(path)
            except (OSError, UnicodeDecodeError) as exc:
                left.append(f"{path} ({exc})")
        said = []
        if put:
            said.append(f"the files written before it were put back as they were: {', '.join(reversed(put))}")
        if kept:
            said.append(f"changed since they were written, kept as they are: {', '.join(reversed(kept))}")
        if left:
            said.append(
                f"these files keep the offer's text, which could not be taken back: {', '.join(left)}"
            )
        return "; ".join(said)

    def _unchanged(self, offer: Offer) -> bool:
        """Whether the user's tree holds exactly what the offer starts from (then the editor may
        write the agent's texts as they are; else the apply merges on disk). :class:`PatchNotApplied`
        for a path that leads out of the repository."""
        unchanged = True
        for change in offer.patch.changes:
            target = (self.repo / change.path).resolve()
            if not target.is_relative_to(self.repo.resolve()):
                raise PatchNotApplied(f"not applied: {change.path} leads out of the repository")
            here = blob_id(target.read_bytes()) if target.is_file() else None
            unchanged = unchanged and here == (change.old_oid if change.old_mode else None)
        return unchanged

    async def apply(
        self, offer: Offer, write_text: WriteText | None = None, *, markers: bool = False
    ) -> tuple[Applied, str]:
        """Write the offer into the user's tree: what was written, and how (``editor``: through
        ``write_text``, when given, every change is a text file added or edited and the tree holds
        what the offer starts from; else ``disk``, atomically, merged with the user's edits made
        since: :func:`~clover_agent.handback.apply.apply_patch_set`, ``markers`` as there). Raises
        :class:`PatchNotApplied` (nothing written) when nothing can be, or a PreHandBack hook
        vetoed it."""
        await veto_check(self.hooks, offer.patch, offer.verdict)
        if write_text is not None and offer.as_text and await asyncio.to_thread(self._unchanged, offer):
            written: list[str] = []
            paths = [c.path for c in offer.patch.changes]
            made = await asyncio.to_thread(_missing_folders, self.repo, paths)
            try:
                for change in offer.patch.changes:
                    new = offer.texts[change.path][1]
                    assert new is not None
                    await write_text(str(self.repo / change.path), new)
                    written.append(change.path)
            except OSError as exc:  # all or nothing: the files written before it are put back
                raise OSError(f"{exc}; {await self._take_back(offer, written, write_text, made)}") from exc
            applied, how = Applied([c.path for c in offer.patch.changes]), "editor"
        else:
            applied = await asyncio.to_thread(apply_patch_set, self.repo, offer.patch, markers=markers)
            how = "disk"
        self.applied.update(applied.files)
        # what was handed back is the start of the next offer; what was left out is offered again
        done = offer.patch if not applied.left_out else self.stock.subset(offer.patch, applied.files)
        self.stock.advance(done)
        return applied, how


async def _put_back(
    repo: Path, path: str, old: str | None, new: str, write_text: WriteText, made: list[Path]
) -> bool:
    """``path`` as it was before the editor wrote ``new`` into it: its old text written back through
    the editor, or, a file the offer added, removed from the disk (the editor has no request for
    that) with the folders ``made`` for it that are empty now. False, and nothing done, when it no
    longer holds what was written (the user's since)."""
    target = repo / path

    def holds_new() -> bool:
        try:
            return target.is_file() and not target.is_symlink() and target.read_text(encoding="utf-8") == new
        except UnicodeDecodeError:
            return False

    if not await asyncio.to_thread(holds_new):
        return False
    if old is not None:
        await write_text(str(target), old)
    else:

        def remove() -> None:
            target.unlink()
            for folder in made:  # deepest first; one that is not empty is someone's: kept
                try:
                    folder.rmdir()
                except OSError:
                    return

        await asyncio.to_thread(remove)
    return True


def _missing_folders(repo: Path, paths: list[str]) -> dict[str, list[Path]]:
    """For each path, the folders above it in ``repo`` that do not exist yet, deepest first."""
    found: dict[str, list[Path]] = {}
    for path in paths:
        missing: list[Path] = []
        folder = (repo / path).parent
        while folder != repo and folder.is_relative_to(repo) and not os.path.lexists(folder):
            missing.append(folder)
            folder = folder.parent
        found[path] = missing
    return found


async def veto_check(hooks: Hooks | None, patch: PatchSet, verdict: str) -> None:
    """Run the PreHandBack hooks on ``patch`` before it is written into the user's tree (every
    front end's apply goes through here); :class:`PatchNotApplied` with the hook's reason when one
    vetoes it."""
    if hooks is None or not hooks.any("PreHandBack"):
        return
    veto = await hooks.pre_hand_back(patch.files, patch.patch, verdict)
    if veto is not None:
        raise PatchNotApplied(f"not applied: {veto}")
