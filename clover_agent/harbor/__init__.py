"""Harbor's agent for clover-agent (docs/harbor.md): ``clover_agent.harbor.agent:CloverAgent``.

It runs in Harbor's own process (Python >= 3.12), where clover-agent's dependencies are not
installed: this package imports only the standard library, ``harbor`` and clover-agent's version.
It installs clover-agent in the task's container and runs ``clover-agent run`` there.
"""
