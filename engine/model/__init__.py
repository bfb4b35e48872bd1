"""The model: its configuration, layers, per-pass context and committed state (plain PyTorch)."""
