"""The operator console."""
