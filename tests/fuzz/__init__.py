"""Hypothesis fuzzing of every RPC of both services against real in-process servers."""
