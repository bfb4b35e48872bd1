"""The TUI's key bindings and slash commands, listed once: the app binds them; ``/help``, the README,
the ``/`` menu and the command palette show them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Key:
    keys: str  # as Textual spells them, comma-separated
    action: str  # the app's action ("" where a widget handles the key itself)
    description: str
    where: str = "anywhere"


KEYS: tuple[Key, ...] = (
    Key("enter", "", "send the request (or pick the highlighted @path or /command)", "prompt"),
    Key("ctrl+j,shift+enter,alt+enter", "", "new line", "prompt"),
    Key("up,down", "", "previous / next request from history (on the first / last line)", "prompt"),
    Key("tab", "", "complete the @path or /command being typed (the prompt keeps the focus)", "prompt"),
    Key("/", "", "first in the prompt: the menu of the commands (type to filter, esc closes)", "prompt"),
    Key("?", "", "on an empty prompt: the help (keys and commands)", "prompt"),
    Key("ctrl+l", "clear_prompt", "clear the prompt (up brings the text back)", "prompt"),
    Key("escape", "interrupt", "interrupt the agent; it waits for your message"),
    Key(
        "ctrl+c",
        "ctrl_c",
        "copy the selection; else clear the prompt; else interrupt the agent; else, pressed twice, quit",
    ),
    Key(
        "ctrl+q",
        "quit",
        "quit (the session stays saved, and the command that resumes it is printed); with changes not in "
        "your tree yet, it first names them: `q` quits anyway, `a` reviews them (/apply), `esc` stays",
    ),
    Key(
        "shift+tab",
        "toggle_plan",
        "plan mode on / off (/plan): the agent proposes a plan, read-only, for you to approve first",
    ),
    Key("ctrl+t", "toggle_thinking", "show / fold the model's thinking"),
    Key("ctrl+o", "expand", "expand / fold the focused or newest long output"),
    Key("ctrl+d", "diff", "show the session's changes (/diff)"),
    Key("pageup,pagedown", "scroll_transcript", "scroll the transcript"),
    Key("f1", "help", "help: keys and commands (/help)"),
    Key("ctrl+p", "", "the command palette: search the commands and run one"),
    Key("f2", "toggle_theme", "switch between the dark and the light theme"),
    Key(
        "y / a / n / f",
        "",
        "allow once / always (the dialog says what that allows) / deny / deny, saying what to do instead",
        "approval",
    ),
    Key("space / enter", "", "accept or reject the file / apply the accepted files", "/apply"),
    Key(
        "a / e / r / l",
        "",
        "approve (under the policy chosen there) / edit (ctrl+s keeps the edit) / reject, saying what to "
        "change / leave plan mode",
        "plan",
    ),
)


@dataclass(frozen=True)
class Command:
    name: str
    usage: str
    description: str

    @property
    def needs_argument(self) -> bool:
        """Whether the usage names an argument that is not optional (``/sandbox WHAT``)."""
        return any(not word.startswith("[") for word in self.usage.split()[1:])


COMMANDS: tuple[Command, ...] = (
    Command(
        "undo", "/undo [N]", "put the workspace back as it was before request N (no N: pick from a list)"
    ),
    Command("diff", "/diff", "show the session's changes your tree does not hold yet"),
    Command(
        "apply",
        "/apply [markers]",
        "review the changes file by file and apply the accepted ones to your tree, merged with your own "
        "edits (markers: where they overlap, both between conflict markers)",
    ),
    Command("tests", "/tests [TARGET]", "run the tests (or TARGET) in the sandbox now"),
    Command(
        "plan",
        "/plan [on/off/show]",
        "plan mode (no argument: on / off): the agent looks, read-only, and proposes a plan you approve, "
        "edit or reject before anything changes; show: the plan proposed or being carried out",
    ),
    Command("policy", "/policy [NAME]", "show or set which calls run, ask or are refused"),
    Command("model", "/model", "show the backend and the model"),
    Command("mcp", "/mcp", "list the MCP servers: running or why not, and their tools"),
    Command("usage", "/usage", "tokens in and out, model calls and time: per request and in all"),
    Command(
        "sandbox",
        "/sandbox WHAT",
        "after a failed start: retry (start it again), local or docker (one of that kind; local: no isolation)",
    ),
    Command("clear", "/clear", "start a new conversation (the workspace keeps its changes)"),
    Command("export", "/export [FILE]", "write the transcript as Markdown (default: in the session folder)"),
    Command("help", "/help", "keys and commands"),
    Command("quit", "/quit", "quit"),
)


def parse_command(text: str) -> tuple[str, str] | None:
    """``("name", "argument")`` for a slash command, None for a plain request."""
    stripped = text.strip()
    if not stripped.startswith("/") or stripped.startswith("//"):
        return None
    name, _, argument = stripped[1:].partition(" ")
    return name.lower(), argument.strip()
