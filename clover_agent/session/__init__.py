"""What every interactive session shares, whichever front end drives it (the TUI, ACP).

``store``: the saved sessions (``<repo>/.clover/sessions/<id>/``, signed trajectories) that both
list, load and resume; ``events``: the session's own events beside the agent's (a request started,
requests undone, the sandbox's state, a notice), recorded in the same trajectory.
"""
