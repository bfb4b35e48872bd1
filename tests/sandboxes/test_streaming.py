"""``exec(on_output=...)``: a command's output in pieces while it runs, through the real runner of
each sandbox kind: all of it (a character split between two writes comes whole), each piece
bounded, and the workspace named as the model sees it."""

from __future__ import annotations

from clover_agent.sandboxes.base import Sandbox
from clover_agent.sandboxes.runner import STREAM_PIECE_BYTES


async def test_pieces_add_up_to_the_output_and_keep_characters_whole(sandbox: Sandbox) -> None:
    pieces: list[str] = []
    # é is two bytes, written apart; the escape sequence is passed on raw (a display sanitises it)
    command = "printf 'a\\303'; sleep 0.3; printf '\\251b\\n\\033[2J'; sleep 0.3; echo $PWD"
    result = await sandbox.exec(command, on_output=pieces.append)
    assert result.exit_code == 0
    assert result.output == "aéb\n\x1b[2J/workspace\n"
    assert "".join(pieces) == result.output
    assert all(pieces) and not any("\ufffd" in p for p in pieces)


async def test_a_flood_comes_in_bounded_pieces_and_whole_in_the_result(sandbox: Sandbox) -> None:
    pieces: list[str] = []
    total = 3 * 1024 * 1024
    result = await sandbox.exec(f"head -c {total} /dev/zero | tr '\\0' x", on_output=pieces.append)
    assert result.output == "x" * total  # the result is not cut by the stream
    marker = "[... 99999999 bytes not shown as they came ...]\n"
    assert pieces and all(len(p) <= STREAM_PIECE_BYTES + len(marker) for p in pieces)
    shown = "".join(p for p in pieces if not p.startswith("[..."))
    assert set(shown) <= {"x"}
