"""Reading and writing text files without changing what the tools did not touch.

The encoding is UTF-8, or Latin-1 when the bytes are not valid UTF-8 (Latin-1 decodes any
byte, so the file round-trips byte for byte). A file whose line breaks are all CRLF is a CRLF
file: text the model writes into it gets CRLF too. Binary files (a NUL byte among the first
``_BINARY_SNIFF_BYTES``) and files over :data:`MAX_TEXT_BYTES` are refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from clover_agent.tools.base import ToolError

MAX_TEXT_BYTES = 10 * 1000 * 1000
_BINARY_SNIFF_BYTES = 8192


@dataclass
class TextFile:
    text: str  # decoded content, line breaks as in the file
    encoding: str  # "utf-8" or "latin-1"
    newline: str  # "\r\n" for a CRLF file, else "\n"

    def encode(self, text: str, path: str) -> bytes:
        try:
            return text.encode(self.encoding)
        except UnicodeEncodeError as exc:
            bad = text[exc.start : exc.end]
            raise ToolError(
                f"The file {path} is {self.encoding}-encoded and cannot hold {bad!r}; nothing was written."
            ) from None

    def with_file_newlines(self, text: str) -> str:
        """``text`` with its line breaks made the file's own."""
        if self.newline == "\n":
            return text
        return text.replace("\r\n", "\n").replace("\n", "\r\n")


def is_binary(data: bytes) -> bool:
    return b"\0" in data[:_BINARY_SNIFF_BYTES]


def decode_bytes(data: bytes, *, partial: bool = False) -> tuple[str, str]:
    """``(text, encoding)``: UTF-8 when the bytes are valid UTF-8, else Latin-1. With ``partial``
    (bytes cut from a longer file) a character cut at the end does not count against UTF-8."""
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError as exc:
        if partial and exc.reason == "unexpected end of data" and len(data) - exc.start < 4:
            return data[: exc.start].decode("utf-8"), "utf-8"
        return data.decode("latin-1"), "latin-1"


def decode_text(data: bytes, path: str) -> TextFile:
    """Decode a file's bytes; :class:`ToolError` for binary or oversized files."""
    if len(data) > MAX_TEXT_BYTES:
        raise ToolError(
            f"The file {path} is {len(data):,} bytes, over the {MAX_TEXT_BYTES:,}-byte limit for the editor. "
            "Use the shell (head, sed -n, grep -n) to work with it."
        )
    if is_binary(data):
        raise ToolError(f"The file {path} appears to be binary; the editor only works on text files.")
    text, encoding = decode_bytes(data)
    crlf = text.count("\r\n")
    newline = "\r\n" if crlf and crlf == text.count("\n") else "\n"
    return TextFile(text, encoding, newline)
