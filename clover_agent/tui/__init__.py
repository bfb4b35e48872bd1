"""The Textual TUI: pair-programming with the agent in a terminal (``clover-agent`` / ``clover-agent tui``).

:class:`~clover_agent.tui.app.CloverApp` draws; :class:`~clover_agent.tui.session.TuiSession` runs the
sandbox, the backend and the agent in a thread of their own and drives the agent through its seams
(its commands are in :mod:`clover_agent.tui.commands`); :mod:`clover_agent.tui.handback` applies
accepted files to the working tree; :mod:`clover_agent.session.store` saves and finds sessions.
"""
