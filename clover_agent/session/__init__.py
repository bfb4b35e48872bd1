"""What every agent session shares, whichever front end drives it.

``assembly``: the one place an agent session is opened and closed (sandbox, MCP servers, policy
and tools, the agent, the system prompt from the sandbox's facts), used by ``fix`` (so the CI bot
and ``eval``), the TUI and ACP. For the interactive ones (the TUI, ACP): ``store``, the saved
sessions (``<repo>/.clover/sessions/<id>/``, signed trajectories) both list, load and resume, and
``events``, the session's own events beside the agent's (a request started, requests undone, the
sandbox's state, a notice), recorded in the same trajectory.
"""
