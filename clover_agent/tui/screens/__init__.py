"""The TUI's dialogs (modal screens), one per module."""
