"""``clover-agent acp``: the agent for editors, over the Agent Client Protocol (JSON-RPC on stdio).

:mod:`~clover_agent.acp.server` answers the protocol's methods (built on the ``acp`` SDK);
:mod:`~clover_agent.acp.session` drives one :class:`~clover_agent.agent.loop.Agent` per ACP session
through the same seams as the TUI (run / continue, interrupt, approvals); :mod:`~clover_agent.acp.updates`
turns the agent's events into ``session/update`` notifications; the session offers its changes to the editor
judged as ``fix`` judges them (:mod:`clover_agent.handback.session`); :mod:`~clover_agent.acp.transport` frames the messages and
keeps stdout for them alone. docs/acp.md says how editors start it.
"""
