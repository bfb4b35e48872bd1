"""Tools the model calls (imports as ``clover_agent.tools``)."""
