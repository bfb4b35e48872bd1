"""The MCP SDK's log records feed the line that says why a server did not start: a start reads
the records that came after it began, however many the process kept before (only the last 20
are held)."""

from __future__ import annotations

import logging

from clover_agent.tools.mcp import _SdkLog


def _record(text: str) -> logging.LogRecord:
    return logging.LogRecord("mcp.client.stdio", logging.WARNING, __file__, 1, text, None, None)


def test_a_start_reads_the_records_since_it_began_after_many_earlier_ones() -> None:
    log = _SdkLog()
    for n in range(25):  # more than are held: before, a start then read nothing new
        log.emit(_record(f"an earlier server's record {n}"))
    began = log.count
    assert log.since(began) == []
    log.emit(_record("Failed to parse JSONRPC message from server"))
    assert log.since(began) == ["Failed to parse JSONRPC message from server"]
    assert len(log.lines) == 20
