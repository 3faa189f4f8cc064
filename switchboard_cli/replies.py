"""The agent `chat` and `gateway` run: an echo, or a module:function of the user's."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any, cast

import click


def echo_agent(turn: Any) -> str:
    """A stand-in agent for trying the plumbing: it says what it got."""
    text = turn.state.state.inbox[-1].message.content if turn.state.state.inbox else ""
    return f"(echo) {text} [{len(turn.history)} earlier messages in this conversation]"


def load_callback(spec: str) -> Callable[[Any], str]:
    """`module:function`, imported as `python -m` would: the current directory first."""
    module, _, function = spec.partition(":")
    if not module or not function:
        raise click.BadParameter("use module:function, e.g. mybot:reply", param_hint="--callback")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found = getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError) as exc:
        raise click.BadParameter(f"{spec}: {exc}", param_hint="--callback") from exc
    if not callable(found):
        raise click.BadParameter(f"{spec} is not callable", param_hint="--callback")
    return cast(Callable[[Any], str], found)
