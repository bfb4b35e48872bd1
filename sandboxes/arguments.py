"""What may cross into the sandbox: text a program, a file name or an environment can hold.

Checked on the host before a request is sent, so a bad argument is a :class:`SandboxArgumentError`
naming it, and the sandbox (which could not have run it anyway) stays usable.
"""

from __future__ import annotations

from clover_agent.sandboxes.base import SandboxArgumentError

#: What the request fields are called in error messages.
_FIELD_NAMES = {"command": "the command", "path": "the path", "cwd": "the working folder"}


def check_text(value: str, what: str) -> None:
    """Raise :class:`SandboxArgumentError` when ``value`` cannot reach a program or a file name:
    a NUL byte ends a C string; a lone surrogate (other than the ``surrogateescape`` form of an
    undecodable byte, as file names arrive) is no character at all."""
    nul = value.find("\0")
    if nul >= 0:
        raise SandboxArgumentError(
            f"{what} contains a NUL byte (character {nul + 1}), which no command, file name or "
            "environment variable can hold; remove it (in a command, write it as an escape such as "
            "printf '\\0')"
        )
    try:
        value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        raise SandboxArgumentError(
            f"{what} contains a lone surrogate (\\u{ord(value[exc.start]):04x}, character "
            f"{exc.start + 1}), which is not valid Unicode; remove it or write the character it was meant to be"
        ) from None


def check_fields(fields: dict[str, object]) -> None:
    """:func:`check_text` on a request's text fields (``data`` is base64, always clean)."""
    for name, value in fields.items():
        if isinstance(value, str) and name != "data":
            check_text(value, _FIELD_NAMES.get(name, f"the {name}"))
        elif name == "env" and isinstance(value, dict):
            for key, item in value.items():
                check_text(str(key), "an environment variable's name")
                if "=" in str(key) or not str(key):
                    raise SandboxArgumentError(
                        f"the environment variable name {key!s} is empty or contains `=`; use a plain name"
                    )
                check_text(str(item), f"the environment variable {key}")
