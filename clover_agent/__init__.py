"""clover-agent: a coding-agent runtime built around Clover-35B-A3B."""

__version__ = "0.1.0"
