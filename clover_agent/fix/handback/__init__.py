"""The hand-back: what a run gives the user, decided on the host (docs/architecture.md, "fix").

The host's snapshots and the patch (``stock``, ``snapshot``, ``shadow``, ``hostgit``), the after-runs
in a fresh sandbox (``verify``, ``heldout``), the judgement (``evidence``, ``weakened``,
``verdict``), and giving it back (``paths``, ``apply``, ``patches``, ``decision``).
"""
