"""The GitHub side of the clover-agent action (action.yml): who may start a run and on what
(``decide``), the one progress comment (``progress``) and handing a verified patch back as a
commit and a pull request, a review reply with a ``suggestion`` block or a check run
(``publish``). Standard library only: it runs before clover-agent is
installed. GitHub's REST API is ``$GITHUB_API_URL``; results go to ``$GITHUB_OUTPUT``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

WRITE_ACCESS = ("admin", "maintain", "write")
MARKER = "<!-- clover-agent progress -->"
BOT_NAME = "clover-agent"
BOT_EMAIL = "clover-agent@users.noreply.github.com"


class ApiError(Exception):
    def __init__(self, status: int, method: str, path: str, detail: str) -> None:
        super().__init__(f"GitHub API {method} {path}: HTTP {status} {detail}".strip())
        self.status = status


def env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def api(method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """One call to the REST API at ``$GITHUB_API_URL`` with ``$GITHUB_TOKEN``."""
    url = env("GITHUB_API_URL", "https://api.github.com").rstrip("/") + path
    request = urllib.request.Request(
        url,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={
            "Accept": "application/vnd.github+json",
            "Authorization": f"Bearer {env('GITHUB_TOKEN')}",
            "X-GitHub-Api-Version": "2022-11-28",
            "User-Agent": "clover-agent-action",
            "Content-Type": "application/json",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            data = response.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:200]
        raise ApiError(exc.code, method, path, detail) from None
    return json.loads(data) if data.strip() else None


# --- decide ---------------------------------------------------------------------------------


@dataclass
class Decision:
    run: bool
    reason: str
    kind: str = ""  # issue, issue-comment, pr-comment, review-comment, ci-failure
    number: str = ""  # the issue or pull request the progress comment goes on ("" for none)
    ref: str = ""  # what to check out
    base: str = ""  # the branch a new pull request goes into
    branch: str = ""  # the branch the fix is pushed to
    continue_branch: bool = False  # push onto `branch` (the bot's own pull request) instead of a new one
    pr_url: str = ""  # the bot's pull request being continued
    actor: str = ""
    task: str = ""
    head_sha: str = ""  # the commit the CI run failed on (a check run goes on it)
    # a review comment: which comment, on which file and lines of the pull request's head
    comment_id: str = ""
    path: str = ""
    start_line: int = 0
    line: int = 0


def csv(text: str) -> set[str]:
    return {item.strip().lower() for item in re.split(r"[,\s]+", text) if item.strip()}


def is_bot(user: dict[str, Any]) -> bool:
    return user.get("type") == "Bot" or str(user.get("login", "")).endswith("[bot]")


def may_start(user: dict[str, Any], repo: str, allowed_bots: set[str]) -> tuple[bool, str]:
    """Write access (collaborators API) for a person; a bot or GitHub App only by the allow-list
    (the API knows no App as a collaborator: it is never asked about one)."""
    login = str(user.get("login", ""))
    if not login:
        return False, "no actor in the event"
    if is_bot(user):
        name = login.lower()
        if name in allowed_bots or name.removesuffix("[bot]") in allowed_bots:
            return True, f"{login} is an allowed bot"
        return False, f"{login} is a bot not in allowed-bots"
    try:
        answer = api("GET", f"/repos/{repo}/collaborators/{login}/permission")
    except ApiError as exc:
        if exc.status == 404:
            return False, f"{login} is not a collaborator"
        raise
    permission = str((answer or {}).get("permission", "none"))
    if permission in WRITE_ACCESS:
        return True, f"{login} has {permission} access"
    return False, f"{login} has {permission} access, not write"


def mentions(body: str, phrase: str) -> bool:
    return re.search(rf"(?<![\w@/-]){re.escape(phrase)}(?![\w-])", body, re.IGNORECASE) is not None


def request_text(body: str, phrase: str) -> str:
    return re.sub(rf"(?<![\w@/-]){re.escape(phrase)}(?![\w-])", "", body, flags=re.IGNORECASE).strip()


def decide(event_name: str, event: dict[str, Any], inputs: dict[str, str]) -> Decision:
    repo = env("GITHUB_REPOSITORY")
    phrase, prefix = inputs["trigger_phrase"], inputs["branch_prefix"]
    bots = csv(inputs["allowed_bots"])
    run_id = env("GITHUB_RUN_ID", "0")

    if event_name == "workflow_run":
        return decide_ci_failure(event, repo, prefix, bots, run_id)

    if event_name == "issues":
        if event.get("action") != "labeled" or event.get("label", {}).get("name") != inputs["label"]:
            return Decision(False, f"not the label {inputs['label']!r}")
        actor, issue = event.get("sender", {}), event["issue"]
        request, kind = "", "issue"
    elif event_name in ("issue_comment", "pull_request_review_comment"):
        if event.get("action") != "created":
            return Decision(False, "not a new comment")
        comment = event["comment"]
        if not mentions(comment.get("body") or "", phrase):
            return Decision(False, f"the comment does not mention {phrase}")
        actor = comment.get("user", {})
        if event_name == "issue_comment":
            issue = event["issue"]
            kind = "pr-comment" if issue.get("pull_request") else "issue-comment"
            request = request_text(comment.get("body") or "", phrase)
        else:
            issue, kind = event["pull_request"], "review-comment"
            commented = review_target(comment)
            request = (
                f"A review comment on `{comment.get('path', '')}` (line {comment.get('line') or '?'}):\n"
                f"```diff\n{comment.get('diff_hunk', '')}\n```\n{request_text(comment.get('body') or '', phrase)}"
            )
    else:
        return Decision(False, f"the event {event_name} is not one the action handles")

    allowed, why = may_start(actor, repo, bots)
    if not allowed:
        return Decision(False, why, kind=kind, actor=str(actor.get("login", "")))
    number = str(issue["number"])
    task = f"{issue.get('title') or ''}\n\n{issue.get('body') or ''}".strip()
    if request:
        task += f"\n\nThe request (a comment by {actor.get('login')}):\n{request}"
    base_decision = Decision(True, why, kind=kind, number=number, actor=str(actor.get("login")), task=task)
    if kind == "review-comment":
        base_decision.comment_id = str(comment.get("id", ""))
        base_decision.path, base_decision.start_line, base_decision.line = commented
    if kind in ("issue", "issue-comment"):
        base_decision.ref = base_decision.base = str(event["repository"]["default_branch"])
        base_decision.branch = f"{prefix}issue-{number}-{run_id}"
        return base_decision

    pull = api("GET", f"/repos/{repo}/pulls/{number}")
    head, base = pull["head"], pull["base"]
    if (head.get("repo") or {}).get("full_name") != repo:
        return Decision(False, "a pull request from a fork: its branch is not this repository's", kind=kind)
    base_decision.ref = str(head["ref"])
    if str(head["ref"]).startswith(prefix):  # the bot's own pull request: a new commit on it
        base_decision.branch, base_decision.continue_branch = str(head["ref"]), True
        base_decision.base, base_decision.pr_url = str(base["ref"]), str(pull.get("html_url", ""))
        base_decision.task += "\n\n(This continues the work already on this pull request's branch.)"
    else:  # someone's pull request: the fix goes to a pull request stacked on it
        base_decision.base = str(head["ref"])
        base_decision.branch = f"{prefix}pr-{number}-{run_id}"
    return base_decision


def review_target(comment: dict[str, Any]) -> tuple[str, int, int]:
    """The file and the line range of the head a review comment is on; (path, 0, 0) when it has
    none a suggestion could replace (a comment on the old side, or one left outdated)."""
    path, line = str(comment.get("path") or ""), comment.get("line")
    if comment.get("side", "RIGHT") != "RIGHT" or not isinstance(line, int) or line < 1:
        return path, 0, 0
    start = comment.get("start_line")
    if (
        not isinstance(start, int)
        or start < 1
        or start > line
        or comment.get("start_side", "RIGHT") != "RIGHT"
    ):
        start = line
    return path, start, line


def decide_ci_failure(event: dict[str, Any], repo: str, prefix: str, bots: set[str], run_id: str) -> Decision:
    run = event["workflow_run"]
    kind = "ci-failure"
    if event.get("action") != "completed" or run.get("conclusion") != "failure":
        return Decision(False, "the CI run did not fail", kind=kind)
    if (run.get("head_repository") or {}).get("full_name") != repo:
        return Decision(False, "the CI run is of a fork's code", kind=kind)
    if run.get("event") not in ("push", "pull_request"):
        return Decision(
            False, f"the CI run was started by {run.get('event')}, not a push or a pull request", kind=kind
        )
    branch = str(run.get("head_branch") or "")
    if branch.startswith(prefix):
        return Decision(False, f"{branch} is the bot's own branch", kind=kind)
    # Both who made the commit's run (actor) and who started this attempt (triggering_actor).
    for role in ("actor", "triggering_actor"):
        user = run.get(role) or {}
        allowed, why = may_start(user, repo, bots)
        if not allowed:
            return Decision(False, f"{role}: {why}", kind=kind, actor=str(user.get("login", "")))
    sha = str(run["head_sha"])
    number = ""
    pulls = [p for p in run.get("pull_requests") or [] if (p.get("head") or {}).get("ref") == branch]
    if run.get("event") == "pull_request":
        if not pulls:
            return Decision(False, "the CI run names no pull request of this repository", kind=kind)
        number = str(pulls[0]["number"])
    task = (
        f"The CI run {run.get('html_url', '')} failed on the branch {branch} at {sha[:12]}. "
        "Make its failing tests pass."
    )
    return Decision(
        True,
        "the CI run failed; actor and triggering actor may start the bot",
        kind=kind,
        number=number,
        ref=sha,
        base=branch,
        branch=f"{prefix}ci-{sha[:12]}-{run_id}",
        actor=str((run.get("actor") or {}).get("login", "")),
        task=task,
        head_sha=sha,
    )


def write_outputs(values: dict[str, str]) -> None:
    path = env("GITHUB_OUTPUT")
    lines = []
    for key, value in values.items():
        flat = value.replace("\r", " ").replace("\n", " ")
        lines.append(f"{key}={flat}\n")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.writelines(lines)
    else:
        sys.stdout.writelines(lines)


def cmd_decide(args: argparse.Namespace) -> int:
    event = json.loads(Path(env("GITHUB_EVENT_PATH")).read_text())
    inputs = {
        "trigger_phrase": args.trigger_phrase,
        "label": args.label,
        "allowed_bots": args.allowed_bots,
        "branch_prefix": args.branch_prefix,
    }
    decision = decide(env("GITHUB_EVENT_NAME"), event, inputs)
    state = Path(args.state)
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text(json.dumps(asdict(decision), indent=2))
    if decision.run:
        task_file = state.with_name("task.md")
        task_file.write_text(decision.task + "\n", encoding="utf-8")
    print(f"clover-agent: {'runs' if decision.run else 'does not run'}: {decision.reason}")
    write_outputs(
        {
            "run": "true" if decision.run else "false",
            "reason": decision.reason,
            "number": decision.number,
            "ref": decision.ref,
            "pr-url": decision.pr_url,
        }
    )
    return 0


# --- progress -------------------------------------------------------------------------------


def run_link() -> str:
    server, repo, run_id = (
        env("GITHUB_SERVER_URL", "https://github.com"),
        env("GITHUB_REPOSITORY"),
        env("GITHUB_RUN_ID"),
    )
    return f"{server}/{repo}/actions/runs/{run_id}"


def tests_line(result: dict[str, Any], phase: str) -> str:
    counts = (result.get("tests") or {}).get(phase)
    if not counts:
        return "not run"
    return f"{counts.get('passed', 0)} passed, {counts.get('failed', 0)} failed, {counts.get('errors', 0)} errors"


STAGES = ("accepted", "ready", "done")


def progress_body(decision: dict[str, Any], stage: str, out: Path | None, pr_url: str, code: str) -> str:
    reached = STAGES.index(stage)
    mark = ["[x]" if i <= reached else "[ ]" for i in range(len(STAGES))]
    lines = [
        MARKER,
        "### clover-agent",
        "",
        f"- {mark[0]} request accepted ({decision['reason']})",
        f"- {mark[1]} clover-agent installed and its sandbox image ready",
        f"- {mark[2]} the bot's run finished",
        "",
    ]
    result: dict[str, Any] = {}
    if out is not None and (out / "result.json").is_file():
        result = json.loads((out / "result.json").read_text())
    if stage == "done":
        verdict = result.get("verdict") or "none"
        lines += [
            f"**Status:** `{result.get('status', 'no result')}` (exit {result.get('exit_code', code or '?')}), "
            f"verdict `{verdict}`",
            "",
            f"- tests before: {tests_line(result, 'target_before')}",
            f"- tests after: {tests_line(result, 'target_after')}",
        ]
        if pr_url:
            lines += ["", f"The verified fix: {pr_url}"]
        if out is not None and (out / "summary.md").is_file():  # made fit for a comment by the bot
            lines += [
                "",
                "<details><summary>The bot's report</summary>",
                "",
                (out / "summary.md").read_text(),
                "</details>",
            ]
    else:
        lines += ["Working on it."]
    lines += ["", f"[The workflow run]({run_link()})"]
    return "\n".join(lines) + "\n"


def cmd_progress(args: argparse.Namespace) -> int:
    decision = json.loads(Path(args.state).read_text())
    repo = env("GITHUB_REPOSITORY")
    if not decision.get("number"):
        print("clover-agent: no issue or pull request to comment on")
        return 0
    body = progress_body(
        decision, args.stage, Path(args.out) if args.out else None, args.pr_url, args.exit_code
    )
    if args.comment_id:
        api("PATCH", f"/repos/{repo}/issues/comments/{args.comment_id}", {"body": body})
        comment_id = args.comment_id
    else:
        created = api("POST", f"/repos/{repo}/issues/{decision['number']}/comments", {"body": body})
        comment_id = str(created["id"])
    write_outputs({"comment-id": comment_id})
    return 0


# --- publish --------------------------------------------------------------------------------


@dataclass
class Hunk:
    path: str
    old_start: int
    lines: list[str]  # the hunk's body: " context", "-removed", "+added"

    @property
    def first(self) -> int:
        """The index in the old file's lines where the hunk starts (a hunk of additions alone
        names the line it goes after)."""
        has_old = any(t[:1] in (" ", "-") for t in self.lines)
        return self.old_start - 1 if has_old else self.old_start

    def within(self, start: int, end: int) -> bool:
        """Whether every change is to old lines ``start``..``end`` (1-based): removed lines among
        them, added lines before one of them or right after the last."""
        number = self.first + 1
        for text in self.lines:
            if text.startswith("-"):
                if not start <= number <= end:
                    return False
                number += 1
            elif text.startswith("+"):
                if not start <= number <= end + 1:
                    return False
            else:
                number += 1
        return True


HUNK_HEAD = re.compile(r"@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@")
ONLY_IN_A_COMMIT = (
    "new file",
    "deleted file",
    "rename ",
    "copy ",
    "similarity",
    "old mode",
    "new mode",
    "Binary",
)


def parse_patch(patch: str) -> list[Hunk] | None:
    """The text hunks of a unified diff as git writes it; None when it holds anything else (a
    binary, new, deleted or renamed file, a mode change, a missing final newline) that only a
    commit can carry."""
    hunks: list[Hunk] = []
    header, old, path = False, "", ""
    for text in patch.splitlines():
        if text.startswith("diff --git "):
            header, old, path = True, "", ""
        elif header and text.startswith(ONLY_IN_A_COMMIT):
            return None
        elif header and text.startswith("--- "):
            old = text[4:]
        elif header and text.startswith("+++ "):
            new = text[4:]
            if not new.startswith("b/") or old != "a/" + new[2:]:
                return None
            path = new[2:]
        elif m := HUNK_HEAD.match(text):
            if not path:
                return None
            header = False
            hunks.append(Hunk(path, int(m[1]), []))
        elif not header and hunks and text[:1] in (" ", "-", "+"):
            hunks[-1].lines.append(text)
        elif text.startswith("\\"):
            return None
    return hunks


def apply_hunks(old: list[str], hunks: list[Hunk]) -> list[str] | None:
    """``old`` with ``hunks`` (of one file, in order) applied; None when a line the patch expects
    is not there."""
    out: list[str] = []
    at = 0
    for hunk in sorted(hunks, key=lambda h: h.old_start):
        if hunk.first < at:
            return None
        out += old[at : hunk.first]
        at = hunk.first
        for text in hunk.lines:
            if text.startswith("+"):
                out.append(text[1:])
                continue
            if at >= len(old) or old[at] != text[1:]:
                return None
            if text.startswith(" "):
                out.append(old[at])
            at += 1
    return out + old[at:]


def suggestion(patch: str, path: str, start: int, end: int, head_text: str) -> str | None:
    """What lines ``start``..``end`` of ``path`` (its text at the head: ``head_text``) become under
    ``patch``, when every change the patch makes is to those lines; None otherwise."""
    hunks = parse_patch(patch)
    old = head_text.splitlines()
    if not hunks or not 1 <= start <= end <= len(old) or any(h.path != path for h in hunks):
        return None
    if not all(h.within(start, end) for h in hunks) or (new := apply_hunks(old, hunks)) is None:
        return None
    return "\n".join(new[start - 1 : end + len(new) - len(old)])


def fence_for(text: str) -> str:
    return "`" * max(3, _longest_backticks(text) + 1)


def _longest_backticks(text: str) -> int:
    return max((len(m) for m in re.findall(r"`+", text)), default=0)


def git(*args: str, extra_env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        ["git", *args], capture_output=True, text=True, env={**os.environ, **(extra_env or {})}, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"git {args[0]} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def push_env() -> dict[str, str]:
    """The token as an HTTP header for this one push, through git's environment configuration:
    never on a command line, never written to .git/config (the sandbox has had its copy)."""
    token = base64.b64encode(f"x-access-token:{env('GITHUB_TOKEN')}".encode()).decode()
    return {
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "http.extraheader",
        "GIT_CONFIG_VALUE_0": f"AUTHORIZATION: basic {token}",
    }


def cmd_publish(args: argparse.Namespace) -> int:
    decision = json.loads(Path(args.state).read_text())
    out = Path(args.out)
    result = json.loads((out / "result.json").read_text())
    if result.get("exit_code") != 0:
        print(f"clover-agent: the run is {result.get('status')}, not fixed: nothing is handed back")
        return 0
    if any(str(path).startswith(".github/") for path in result.get("files_changed") or []):
        print("::error::the patch changes files under .github/; it is not pushed")
        return 1
    patch = (out / "patch.diff").read_text(encoding="utf-8", errors="replace")
    if decision["kind"] == "review-comment" and args.review_fix == "suggestion":
        url = reply_with_suggestion(decision, result, patch)
        if url:
            print(f"clover-agent: the fix is a suggestion on the review comment: {url}")
            write_outputs({"pr-url": "", "hand-back-url": url})
            return 0
        print("clover-agent: the fix goes beyond the commented lines: it goes to a pull request")
    if decision["kind"] == "ci-failure" and args.ci_failure_output == "check-run":
        url = post_check_run(decision, result, patch)
        print(f"clover-agent: the fix is in a check run on {decision['head_sha'][:12]}: {url}")
        write_outputs({"pr-url": "", "hand-back-url": url})
        return 0
    repo, branch = env("GITHUB_REPOSITORY"), decision["branch"]
    where = f"#{decision['number']}" if decision["number"] else decision["base"]
    subject = f"clover-agent: a fix for {where}"
    # The patch is a model's work: it is applied and pushed, never run here.
    if not decision["continue_branch"]:
        git("switch", "--quiet", "-c", branch)
    git("apply", "--index", str(out / "patch.diff"))
    git(
        "-c",
        f"user.name={BOT_NAME}",
        "-c",
        f"user.email={BOT_EMAIL}",
        "commit",
        "--quiet",
        "--no-verify",
        "-m",
        subject,
    )
    remote = f"{env('GITHUB_SERVER_URL', 'https://github.com')}/{repo}.git"
    git("push", "--quiet", remote, f"HEAD:refs/heads/{branch}", extra_env=push_env())
    if decision["continue_branch"]:
        pr_url = decision["pr_url"]
    else:
        body = (
            out / "summary.md"
        ).read_text() + f"\n\nFor {where}. Made by a model: review it before merging.\n"
        pull = api(
            "POST",
            f"/repos/{repo}/pulls",
            {"title": subject, "head": branch, "base": decision["base"], "body": body, "draft": True},
        )
        pr_url = str(pull["html_url"])
    print(f"clover-agent: pushed {branch}: {pr_url}")
    write_outputs({"pr-url": pr_url, "hand-back-url": pr_url})
    return 0


def verdict_line(result: dict[str, Any]) -> str:
    return (
        f"verdict `{result.get('verdict') or 'none'}`; the target tests before: "
        f"{tests_line(result, 'target_before')}, after: {tests_line(result, 'target_after')}"
    )


def head_file(path: str) -> str | None:
    """The text of ``path`` in the checkout (the pull request's head), or None for a path that
    leaves it, a link or anything not a readable text file."""
    root = Path.cwd().resolve()
    target = root / path
    if not path or Path(path).is_absolute() or ".." in Path(path).parts or not target.is_file():
        return None
    if any(p.is_symlink() for p in [target, *target.parents] if p != root and root in p.parents):
        return None
    try:
        return target.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def reply_with_suggestion(decision: dict[str, Any], result: dict[str, Any], patch: str) -> str:
    """Reply to the review comment with the fix as a ``suggestion`` block when it changes only
    the commented lines; its address, or "" when it does not fit one."""
    path, start, end = decision["path"], decision["start_line"], decision["line"]
    text = head_file(path) if start and decision["comment_id"] else None
    lines = None if text is None else suggestion(patch, path, start, end, text)
    if lines is None:
        return ""
    fence = fence_for(lines)
    body = (
        f"The verified fix for this comment ({verdict_line(result)}):\n\n"
        f"{fence}suggestion\n{lines}\n{fence}\n\n"
        f"Made by a model: review it before committing the suggestion. [The workflow run]({run_link()})\n"
    )
    repo, number = env("GITHUB_REPOSITORY"), decision["number"]
    made = api(
        "POST", f"/repos/{repo}/pulls/{number}/comments/{decision['comment_id']}/replies", {"body": body}
    )
    return str(made.get("html_url", ""))


#: GitHub's limits on a check run's output: characters of text, annotations per request.
CHECK_TEXT_LIMIT = 60_000
CHECK_ANNOTATIONS = 50


def post_check_run(decision: dict[str, Any], result: dict[str, Any], patch: str) -> str:
    """A neutral check run on the failed commit: the fix as the check's details and a notice on
    each changed place. Nothing is pushed. Returns the check run's address."""
    annotations = []
    for hunk in (parse_patch(patch) or [])[:CHECK_ANNOTATIONS]:
        old_lines = sum(1 for t in hunk.lines if t[:1] in (" ", "-"))
        first = max(hunk.first, 1) if old_lines == 0 else hunk.first + 1
        annotations.append(
            {
                "path": hunk.path,
                "start_line": first,
                "end_line": max(first, hunk.first + old_lines),
                "annotation_level": "notice",
                "title": "clover-agent: a verified change here",
                "message": "The verified fix changes these lines; the check's details hold the whole patch.",
                "raw_details": "\n".join(hunk.lines)[:CHECK_TEXT_LIMIT],
            }
        )
    shown = (
        patch
        if len(patch) <= CHECK_TEXT_LIMIT
        else patch[:CHECK_TEXT_LIMIT] + "\n… (cut: the artefact has it all)"
    )
    fence = fence_for(shown)
    output = {
        "title": "A verified fix for the failing tests",
        "summary": f"clover-agent found a fix: {verdict_line(result)}. Made by a model: review it before applying.",
        "text": f"{fence}diff\n{shown}\n{fence}\n",
        "annotations": annotations,
    }
    made = api(
        "POST",
        f"/repos/{env('GITHUB_REPOSITORY')}/check-runs",
        {
            "name": "clover-agent",
            "head_sha": decision["head_sha"],
            "status": "completed",
            "conclusion": "neutral",
            "details_url": run_link(),
            "output": output,
        },
    )
    return str(made.get("html_url", ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="clover_github.py", description=__doc__)
    sub = parser.add_subparsers(required=True)
    p = sub.add_parser("decide", help="whether this event starts a run, and on what")
    p.add_argument("--state", required=True)
    p.add_argument("--trigger-phrase", default="@clover-agent")
    p.add_argument("--label", default="clover-fix")
    p.add_argument("--allowed-bots", default="")
    p.add_argument("--branch-prefix", default="clover/")
    p.set_defaults(func=cmd_decide)
    p = sub.add_parser("progress", help="create or update the progress comment")
    p.add_argument("--state", required=True)
    p.add_argument("--stage", choices=STAGES, required=True)
    p.add_argument("--comment-id", default="")
    p.add_argument("--out", default="")
    p.add_argument("--pr-url", default="")
    p.add_argument("--exit-code", default="")
    p.set_defaults(func=cmd_progress)
    p = sub.add_parser("publish", help="commit a verified patch, push it and open the pull request")
    p.add_argument("--state", required=True)
    p.add_argument("--out", required=True)
    p.add_argument(
        "--review-fix",
        choices=("suggestion", "pull-request"),
        default="suggestion",
        help="a review comment's fix: a suggestion block when it fits the commented lines, or a pull request",
    )
    p.add_argument(
        "--ci-failure-output",
        choices=("pull-request", "check-run"),
        default="pull-request",
        help="a failed CI run's fix: a stacked pull request, or a check run with annotations (nothing pushed)",
    )
    p.set_defaults(func=cmd_publish)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ApiError as exc:
        print(f"::error::{exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
