"""Chat templates shipped with the engine (package data)."""
