"""Fenced code blocks of a Markdown file, with the directives written above them.

Kept free of any Switchboard import, so that a test of any README can use it.

A directive is an HTML comment on the line right above a fence (several may be
stacked, one per line); GitHub and npm render neither:

    <!-- docs: no-run needs a Kubernetes cluster -->
    ```sh
    kubectl apply -f k8s/sqlite/
    ```

The first word after `docs:` is the directive's name, the rest its argument.
What the names mean is up to the test that runs the file; this module only
reads them (`Block.directive`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*docs:\s*(?P<name>[\w-]+)\s*(?P<argument>.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it starts, its language (the info string's first
    word, "" when there is none), its text and the directives above it."""

    path: Path
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    directives: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"

    def directive(self, name: str) -> str | None:
        """The argument of directive `name` ("" when it has none), or None if absent."""
        return self.directives.get(name)


def read_blocks(path: Path) -> list[Block]:
    """Every fenced block of `path`, in order. An unclosed fence is an error: it
    would silently swallow the rest of the file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        end = _closing_line(lines, index, opening)
        indent = len(opening["indent"])
        body = [_dedent(line, indent) for line in lines[index + 1 : end]]
        blocks.append(
            Block(
                path=path,
                line=index + 1,
                language=(opening["info"].split() or [""])[0].lower(),
                code="\n".join(body) + "\n" if body else "",
                directives=_directives_above(lines, index),
            )
        )
        index = end + 1
    return blocks


def _dedent(line: str, indent: int) -> str:
    """A fence indented by N spaces has its content indented by up to N too."""
    return line[min(indent, len(line) - len(line.lstrip(" "))) :]


def _closing_line(lines: list[str], start: int, opening: re.Match[str]) -> int:
    fence = opening["fence"]
    for index in range(start + 1, len(lines)):
        closing = lines[index].strip()
        # A closing fence is the same character, at least as long, with no info string.
        if closing.startswith(fence) and set(closing) == {fence[0]}:
            return index
    raise ValueError(f"unclosed code fence at line {start + 1}")


def _directives_above(lines: list[str], fence_index: int) -> dict[str, str]:
    directives: dict[str, str] = {}
    index = fence_index - 1
    while index >= 0 and (match := _DIRECTIVE.match(lines[index])):
        if match["name"] in directives:
            raise ValueError(f"directive {match['name']!r} twice above line {fence_index + 1}")
        directives[match["name"]] = match["argument"]
        index -= 1
    return directives


__all__ = ["Block", "read_blocks"]
