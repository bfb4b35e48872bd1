"""In-process block-diffusion engine for Clover-35B-A3B (imports as ``clover_agent.engine``)."""
