"""The permission gate: one decision function every gated call goes through.

Rules live on the agent (allow/deny, an action glob, a resource glob); a
session may be narrowed below its agent, restrict-only: denials of every layer
apply (union), and each layer that lists allows must allow too (intersection).
A deny always wins; nothing allowed means denied. The agent's peers are
allow rules for addressing them. Workspace resources ("workspace:<path>")
resolve against the agent's workspace root, and a path that escapes it is
denied whatever the rules say.

A sub-agent (`Agent.parent`) never holds more than its ancestors: at check
time every ancestor's current rules and peers are further layers, each of
which must allow like the agent's own (an ancestor that allows nothing leaves
its sub-agents nothing), and a workspace path must lie inside every
ancestor's root too, judged in that ancestor's frame. A sub-agent whose
lineage is broken (an ancestor missing or archived, a cycle, deeper than
MAX_DEPTH) is allowed nothing. Writes are bounded as well (`excess`), so that
an administrator learns at once when a change would exceed an ancestor.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from session_service.records import Agent, Narrowing, PermissionEffect, PermissionRule
from switchboard import validation
from switchboard.errors import InvalidArgument

WORKSPACE = "workspace:"
MAX_RULES = 1000
#: The most ancestors a sub-agent may have; a deeper one is allowed nothing.
MAX_DEPTH = 8
#: The agent fields a sub-agent's ancestors bound (what `excess` compares).
BOUNDED_FIELDS = frozenset({"permissions", "peers", "workspace_root"})


@dataclass(frozen=True)
class Decision:
    allowed: bool
    #: Which rule decided: "agent[2]", "ancestor[lead][0]", "narrowing[0][1]", or "" for none.
    rule: str
    reason: str


@dataclass(frozen=True)
class Ancestry:
    """An agent's ancestors as they are now, nearest first; or why the chain is broken."""

    agents: tuple[Agent, ...] = ()
    #: Why the lineage is broken, for people ("" when it is whole).
    broken: str = ""
    #: The stable reason of a broken lineage: PARENT_NOT_FOUND, PARENT_ARCHIVED,
    #: PARENT_CYCLE or PARENT_TOO_DEEP.
    reason: str = ""


@dataclass(frozen=True)
class Excess:
    """What a sub-agent would hold beyond an ancestor: the field and why."""

    field: str
    message: str


def checked_rules(field: str, rules: Sequence[PermissionRule]) -> None:
    """Rules as an agent's permissions or a session's narrowing may hold them."""
    if len(rules) > MAX_RULES:
        raise InvalidArgument(field, f"has {len(rules)} rules; the limit is {MAX_RULES}")
    for index, rule in enumerate(rules):
        if rule.effect not in (PermissionEffect.ALLOW, PermissionEffect.DENY):
            raise InvalidArgument(f"{field}[{index}].effect", "must be ALLOW or DENY")
        validation.text(f"{field}[{index}].action", rule.action, max_len=256, required=True)
        validation.text(f"{field}[{index}].resource", rule.resource, max_len=1024)


def peer_rules(peers: Sequence[str]) -> list[PermissionRule]:
    return [
        PermissionRule(effect=PermissionEffect.ALLOW, action="peer.*", resource=f"agent:{p}")
        for p in peers
    ]


def _agent_rules(agent: Agent) -> list[PermissionRule]:
    return list(agent.permissions) + peer_rules(agent.peers)


def _matches(rule: PermissionRule, action: str, resource: str) -> bool:
    return fnmatchcase(action, rule.action) and fnmatchcase(resource, rule.resource or "*")


# -- lineage ------------------------------------------------------------------------------


def ancestry(agent: Agent, load: Callable[[str], Agent | None]) -> Ancestry:
    """Walks up from `agent.parent` with `load` (one read per ancestor)."""
    chain: list[Agent] = []
    seen = {agent.name}
    name = agent.parent
    while name:
        if name in seen:
            return Ancestry(
                tuple(chain), f"agent {name!r} would be its own ancestor", "PARENT_CYCLE"
            )
        if len(chain) == MAX_DEPTH:
            return Ancestry(
                tuple(chain),
                f"the lineage is deeper than {MAX_DEPTH} ancestors",
                "PARENT_TOO_DEEP",
            )
        found = load(name)
        if found is None:
            return Ancestry(tuple(chain), f"ancestor {name!r} does not exist", "PARENT_NOT_FOUND")
        if found.archived:
            return Ancestry(tuple(chain), f"ancestor {name!r} is archived", "PARENT_ARCHIVED")
        chain.append(found)
        seen.add(name)
        name = found.parent
    return Ancestry(tuple(chain))


def bounded_fields(mask_paths: Iterable[str]) -> frozenset[str]:
    """The bounded fields an update mask touches; a new parent re-judges them all."""
    touched = {path.split(".", 1)[0] for path in mask_paths}
    if "parent" in touched:
        return BOUNDED_FIELDS
    return frozenset(touched & BOUNDED_FIELDS)


# -- workspace frames ---------------------------------------------------------------------


def _base(root: str) -> str:
    return posixpath.normpath("/" + root.strip("/")) if root else "/"


def workspace_bases(chain: Sequence[Agent]) -> list[str]:
    """Each agent's workspace root, for a chain nearest first: a sub-agent without
    a root of its own works in its parent's; a top-level one without a root in "/"."""
    bases: list[str] = []
    inherited = "/"
    for agent in reversed(chain):
        inherited = _base(agent.workspace_root) if agent.workspace_root else inherited
        bases.append(inherited)
    return bases[::-1]


def _inside(base: str, path: str) -> str | None:
    """`path` relative to `base`, or None when it lies outside."""
    if path != base and not path.startswith(base.rstrip("/") + "/"):
        return None
    return posixpath.relpath(path, base)


def _absolute(base: str, resource: str) -> str | None:
    """The normalized absolute path of a workspace resource, or None when it escapes `base`."""
    relative = resource[len(WORKSPACE) :]
    if "\\" in relative or "\x00" in relative or relative.startswith("~"):
        return None
    joined = posixpath.normpath(posixpath.join(base, relative))
    return joined if _inside(base, joined) is not None else None


def _framed(resource: str, names: Sequence[str], chain: Sequence[Agent]) -> list[str] | str:
    """The resource as each agent of the chain sees it, or why it is denied."""
    if not resource.startswith(WORKSPACE):
        return [resource] * len(chain)
    bases = workspace_bases(chain)
    absolute = _absolute(bases[0], resource)
    if absolute is None:
        return f"{resource!r} escapes the workspace root"
    framed = []
    for name, base in zip(names, bases, strict=True):
        relative = _inside(base, absolute)
        if relative is None:
            return f"{resource!r} lies outside the workspace root of {name}"
        framed.append(WORKSPACE + relative)
    return framed


# -- deciding -----------------------------------------------------------------------------


def decide(
    agent: Agent,
    narrowing: Sequence[Narrowing],
    action: str,
    resource: str,
    lineage: Ancestry | None = None,
) -> Decision:
    """Decides for the agent (its rules, then each ancestor's, then the session's
    narrowing layers). `lineage`: the agent's ancestors, read once per decision;
    a sub-agent decided without them is denied (fail closed)."""
    if lineage is None:
        lineage = Ancestry(broken="its ancestors were not read") if agent.parent else Ancestry()
    if lineage.broken:
        return Decision(False, "", f"sub-agent {agent.name!r}: {lineage.broken}")
    chain = [agent, *lineage.agents]
    names = ["agent", *(f"ancestor[{a.name}]" for a in lineage.agents)]
    framed = _framed(resource, names, chain)
    if isinstance(framed, str):
        return Decision(False, "", framed)
    layers = [
        (name, _agent_rules(member), seen, True)
        for name, member, seen in zip(names, chain, framed, strict=True)
    ]
    layers += [
        (f"narrowing[{i}]", list(layer.rules), framed[0], False)
        for i, layer in enumerate(narrowing)
    ]
    for name, rules, seen, _ in layers:
        for index, rule in enumerate(rules):
            if rule.effect == PermissionEffect.DENY and _matches(rule, action, seen):
                return Decision(False, f"{name}[{index}]", "denied by rule")
    decided_by = ""
    for name, rules, seen, must_allow in layers:
        allows = [(i, r) for i, r in enumerate(rules) if r.effect == PermissionEffect.ALLOW]
        if not allows and not must_allow:
            continue  # a narrowing that lists no allows restricts by its denials only
        match = next((i for i, r in allows if _matches(r, action, seen)), None)
        if match is None:
            return Decision(False, "", f"no {name} rule allows {action} on {seen}")
        decided_by = decided_by or f"{name}[{match}]"
    return Decision(True, decided_by, "allowed by rule")


# -- the write-time bound -----------------------------------------------------------------


def excess(agent: Agent, ancestors: Sequence[Agent], touched: Collection[str]) -> Excess | None:
    """What `agent` holds beyond one of its ancestors in the `touched` fields, or None.

    Rules are compared as globs (a child's pattern must be contained in one of
    the ancestor's allow patterns), workspace patterns rebased into the
    ancestor's frame. The comparison is conservative: it may refuse a rule the
    ancestor does cover in effect, never accept one it does not.
    """
    bases = workspace_bases([agent, *ancestors])
    for ancestor, base in zip(ancestors, bases[1:], strict=True):
        offset = _inside(base, bases[0])
        if "workspace_root" in touched and offset is None:
            return Excess(
                "agent.workspace_root",
                f"{bases[0]!r} lies outside the workspace root {base!r} of ancestor "
                f"{ancestor.name!r}",
            )
        allows = [r for r in _agent_rules(ancestor) if r.effect == PermissionEffect.ALLOW]
        found = _excess_over(agent, ancestor.name, allows, offset, touched)
        if found is not None:
            return found
    return None


def _excess_over(
    agent: Agent,
    ancestor: str,
    allows: Sequence[PermissionRule],
    offset: str | None,
    touched: Collection[str],
) -> Excess | None:
    if "permissions" in touched:
        for index, rule in enumerate(agent.permissions):
            if rule.effect == PermissionEffect.ALLOW and not _covered(rule, allows, offset):
                return Excess(
                    f"agent.permissions[{index}]",
                    f"allows {rule.action} on {rule.resource or '*'}; ancestor {ancestor!r} "
                    "does not",
                )
    if "peers" in touched:
        for index, rule in enumerate(peer_rules(agent.peers)):
            if not _covered(rule, allows, offset):
                return Excess(
                    f"agent.peers[{index}]",
                    f"{agent.peers[index]!r} is not reachable by ancestor {ancestor!r}",
                )
    return None


def _covered(rule: PermissionRule, allows: Sequence[PermissionRule], offset: str | None) -> bool:
    resource = rule.resource or "*"
    if resource.startswith(WORKSPACE):
        if offset is None:
            return False  # the agent works outside the ancestor's root: nothing to compare
        if offset != ".":
            resource = WORKSPACE + posixpath.join(offset, resource[len(WORKSPACE) :])
    return any(
        glob_within(rule.action, allow.action) and glob_within(resource, allow.resource or "*")
        for allow in allows
    )


# -- glob containment ---------------------------------------------------------------------

_STAR, _ANY = ("*", ""), ("?", "")


def _tokens(pattern: str) -> list[tuple[str, str]]:
    """fnmatch's pattern as tokens: ("*", ""), ("?", ""), ("[", set text) or ("c", char)."""
    tokens: list[tuple[str, str]] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        end = _set_end(pattern, i) if char == "[" else None
        if end is not None:
            tokens.append(("[", pattern[i : end + 1]))
            i = end + 1
            continue
        tokens.append(_STAR if char == "*" else _ANY if char == "?" else ("c", char))
        i += 1
    return tokens


def _set_end(pattern: str, start: int) -> int | None:
    """Where the set opened at `start` closes (as fnmatch reads it); None: a literal '['."""
    j = start + 1
    if j < len(pattern) and pattern[j] == "!":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 1
    return j if j < len(pattern) else None


def glob_within(inner: str, outer: str) -> bool:
    """True when every string `inner` matches, `outer` matches too (conservative:
    a '*', '?' or set of `inner` must meet a '*' or the same token in `outer`)."""
    if inner == outer or outer == "*":
        return True
    a, b = _tokens(inner), _tokens(outer)
    seen: set[tuple[int, int]] = set()
    stack = [(0, 0)]
    while stack:
        i, j = stack.pop()
        if (i, j) in seen:
            continue
        seen.add((i, j))
        if i == len(a):
            if all(token == _STAR for token in b[j:]):
                return True
            continue
        if j == len(b):
            continue
        if b[j] == _STAR:
            stack += [(i, j + 1), (i + 1, j)]  # the star stops here, or takes a[i] too
        elif _one_within(a[i], b[j]):
            stack.append((i + 1, j + 1))
    return False


def _one_within(inner: tuple[str, str], outer: tuple[str, str]) -> bool:
    """One non-star token of `inner` against one non-star token of `outer`."""
    if inner == _STAR:
        return False  # only a star takes a star
    if outer == _ANY or inner == outer:
        return True
    return inner[0] == "c" and outer[0] == "[" and fnmatchcase(inner[1], outer[1])
