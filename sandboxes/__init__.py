"""Where tools run: Docker (default) and local (opt-in) (imports as ``clover_agent.sandboxes``)."""
