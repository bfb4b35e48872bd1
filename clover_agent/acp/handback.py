"""The verified hand-back of an ACP session: the sandbox's changes, checked, offered to the editor.

The host takes stock of the workspace when the sandbox starts (:class:`~clover_agent.fix.handback.stock.Stock`,
as ``fix`` does). After a request the agent finished, :meth:`HandBack.offer` stops the sandbox's
processes, reads what changed into the host's shadow repository (what is never handed back left
out) and runs the test suite on exactly those bytes in a fresh sandbox, and the tamper scan on what
the patch adds to non-test code: the verdict (never "verified": there is no baseline and no
held-out run here; a scan finding or a forged result record makes it "needs review"). Accepted, the
changes are written through the editor (``fs/write_text_file``, so its buffers follow) when it can
write files and every change is a text file added or modified; else on disk with ``fix``'s atomic
apply. Either way a file is written only when the user's tree holds what the session started from
and has no uncommitted change to it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from clover_agent.errors import CloverError
from clover_agent.fix.handback.apply import PatchNotApplied, apply_patch_set, blob_id
from clover_agent.fix.handback.patches import local_changes
from clover_agent.fix.handback.shadow import REGULAR
from clover_agent.fix.handback.stock import PatchSet, Stock
from clover_agent.fix.handback.tamper import scan_changes
from clover_agent.sandboxes import SandboxSpec, create_sandbox
from clover_agent.sandboxes.base import Sandbox
from clover_agent.tools.run_tests import TestReport, run_tests_in

#: Writes one file through the editor: (absolute path, text).
WriteText = Callable[[str, str], Awaitable[None]]


@dataclass
class Offer:
    """What is offered: the patch (host side), the test run on it, and each file's two texts."""

    patch: PatchSet
    report: TestReport | None
    texts: dict[str, tuple[str | None, str | None]]  # path -> (old, new); None: absent or not text
    #: What the tamper scan of the patch and the results channel found (docs/verdict-checks.md).
    review: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """The offer's title word: never "verified" (no held-out run here), "needs review" first."""
        report = self.report
        if self.review:
            more = f" (and {len(self.review) - 1} more)" if len(self.review) > 1 else ""
            return f"needs review: {self.review[0]}{more}"
        if report is None:
            return "not checked (no tests could run)"
        if report.problem and not report.total:
            return f"not checked: {report.problem}"
        if report.all_passed:
            return f"{report.passed} tests pass on the changed files (the patch's own tests, not held out)"
        return f"{report.failed + report.errors} of {report.total} tests fail on the changed files"

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


def _text(data: bytes | None) -> str | None:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


class HandBack:
    """One session's hand-back (see the module docstring); ``folder`` holds its shadow repository."""

    def __init__(self, sandbox: Sandbox, kind: str, spec: SandboxSpec, repo: Path, folder: Path) -> None:
        self.sandbox = sandbox
        self.kind = kind
        self.spec = spec
        self.repo = repo
        self.stock = Stock(folder, repo)

    async def start(self) -> None:
        """Take stock of the workspace as it is now: what a later offer is the change from."""
        await self.stock.record_start(self.sandbox)

    async def offer(self) -> Offer | None:
        """The changes since :meth:`start` (or the last apply) and their verdict; None: no change."""
        patch = await self.stock.record_end(self.sandbox)
        if not patch.changes:
            return None
        shadow = self.stock.shadow
        before, after = shadow.files(patch.base), shadow.files(patch.final)
        wanted = {f"a/{c.path}": before[c.path][1] for c in patch.changes if c.path in before}
        wanted |= {f"b/{c.path}": after[c.path][1] for c in patch.changes if c.path in after}
        blobs = await asyncio.to_thread(shadow.blobs, wanted)
        texts = {
            c.path: (_text(blobs.get(f"a/{c.path}")), _text(blobs.get(f"b/{c.path}"))) for c in patch.changes
        }
        report = await self._verify(patch)
        python = [c for c in patch.changes if c.path.endswith(".py")]
        sides = (
            {c.path: blobs.get(f"a/{c.path}") for c in python},
            {c.path: blobs.get(f"b/{c.path}") for c in python},
        )
        review = [f.describe() for f in scan_changes(*sides)]
        review += [f"test run: {problem}" for problem in (report.integrity if report else [])]
        return Offer(patch, report, texts, review)

    async def _verify(self, patch: PatchSet) -> TestReport | None:
        async with create_sandbox(self.kind, self.spec) as fresh:
            await self.stock.make_like_final(fresh, patch)
            report = await run_tests_in(fresh, None, guarded=True)
        return None if report.framework == "none" else report

    def _check(self, offer: Offer) -> None:
        """:class:`PatchNotApplied` unless the user's tree holds what the session started from."""
        files = [c.path for c in offer.patch.changes]
        dirty = local_changes(self.repo, files)
        if dirty:
            raise PatchNotApplied(
                f"not applied: {', '.join(dirty)} changed in your working tree; commit or stash first"
            )
        for change in offer.patch.changes:
            target = (self.repo / change.path).resolve()
            if not target.is_relative_to(self.repo.resolve()):
                raise PatchNotApplied(f"not applied: {change.path} leads out of the repository")
            here = blob_id(target.read_bytes()) if target.is_file() else None
            if here != (change.old_oid if change.old_mode else None):
                raise PatchNotApplied(f"not applied: {change.path} is not what the session started from")

    async def apply(self, offer: Offer, write_text: WriteText | None) -> tuple[list[str], str]:
        """Write the offer into the user's tree: the files and how (``editor`` or ``disk``)."""
        if write_text is not None and offer.as_text:
            await asyncio.to_thread(self._check, offer)
            for change in offer.patch.changes:
                new = offer.texts[change.path][1]
                assert new is not None
                await write_text(str(self.repo / change.path), new)
            written, how = [c.path for c in offer.patch.changes], "editor"
        else:
            written, how = await asyncio.to_thread(apply_patch_set, self.repo, offer.patch), "disk"
        try:
            await self.start()  # what was handed back is the start of the next offer
        except (CloverError, OSError):
            pass
        return written, how
