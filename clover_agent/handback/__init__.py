"""The hand-back: what a session gives the user's tree, decided and judged on the host.

Every front end (``fix``, ``ci``, ``eval``, the TUI, ACP) goes through it: the host's snapshots and
the patch (``stock``, ``snapshot``, ``shadow``, ``hostgit``), the after-runs in a fresh sandbox
(``verify``, ``heldout``, ``judging``), the verdict and the checks of how tests pass (``evidence``,
``weakened``, ``verdict``, ``checks``, ``tamper``), a session's offers (``session``), and the
atomic apply (``paths``, ``apply``, ``patches``).
"""
