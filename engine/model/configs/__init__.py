"""Model configurations shipped with the engine (package data)."""
