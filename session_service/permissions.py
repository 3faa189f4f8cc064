"""The permission gate: one decision function every gated call goes through.

Rules live on the agent (allow/deny, an action glob, a resource glob); a
session may be narrowed below its agent, restrict-only: denials of every layer
apply (union), and each layer that lists allows must allow too (intersection).
A deny always wins; nothing allowed means denied. The agent's peers are
allow rules for addressing them. Workspace resources ("workspace:<path>")
resolve against the agent's workspace root, and a path that escapes it is
denied whatever the rules say.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from switchboard import validation
from switchboard.errors import InvalidArgument
from switchboard.session.v1 import session_service_pb2 as pb

WORKSPACE = "workspace:"
MAX_RULES = 1000


@dataclass(frozen=True)
class Decision:
    allowed: bool
    #: Which rule decided: "agent[2]", "narrowing[0][1]", "peers", or "" for none.
    rule: str
    reason: str


def checked_rules(field: str, rules: Sequence[pb.PermissionRule]) -> None:
    """Rules as an agent's permissions or a session's narrowing may hold them."""
    if len(rules) > MAX_RULES:
        raise InvalidArgument(field, f"has {len(rules)} rules; the limit is {MAX_RULES}")
    for index, rule in enumerate(rules):
        if rule.effect not in (pb.PERMISSION_EFFECT_ALLOW, pb.PERMISSION_EFFECT_DENY):
            raise InvalidArgument(f"{field}[{index}].effect", "must be ALLOW or DENY")
        validation.text(f"{field}[{index}].action", rule.action, max_len=256, required=True)
        validation.text(f"{field}[{index}].resource", rule.resource, max_len=1024)


def peer_rules(peers: Sequence[str]) -> list[pb.PermissionRule]:
    return [
        pb.PermissionRule(effect=pb.PERMISSION_EFFECT_ALLOW, action="peer.*", resource=f"agent:{p}")
        for p in peers
    ]


def _matches(rule: pb.PermissionRule, action: str, resource: str) -> bool:
    return fnmatchcase(action, rule.action) and fnmatchcase(resource, rule.resource or "*")


def workspace_path(root: str, resource: str) -> str | None:
    """The normalized workspace resource, or None when it escapes the root."""
    relative = resource[len(WORKSPACE) :]
    if "\\" in relative or "\x00" in relative or relative.startswith("~"):
        return None
    base = posixpath.normpath("/" + root.strip("/")) if root else "/"
    joined = posixpath.normpath(posixpath.join(base, relative))
    if joined != base and not joined.startswith(base.rstrip("/") + "/"):
        return None
    return WORKSPACE + posixpath.relpath(joined, base)


def decide(
    agent: pb.Agent, narrowing: Sequence[pb.Narrowing], action: str, resource: str
) -> Decision:
    if resource.startswith(WORKSPACE):
        normalized = workspace_path(agent.workspace_root, resource)
        if normalized is None:
            return Decision(False, "", f"{resource!r} escapes the workspace root")
        resource = normalized
    layers = [("agent", list(agent.permissions) + peer_rules(agent.peers))]
    layers += [(f"narrowing[{i}]", list(layer.rules)) for i, layer in enumerate(narrowing)]
    for name, rules in layers:
        for index, rule in enumerate(rules):
            if rule.effect == pb.PERMISSION_EFFECT_DENY and _matches(rule, action, resource):
                return Decision(False, f"{name}[{index}]", "denied by rule")
    decided_by = ""
    for name, rules in layers:
        allows = [(i, r) for i, r in enumerate(rules) if r.effect == pb.PERMISSION_EFFECT_ALLOW]
        if not allows and name != "agent":
            continue  # a layer that lists no allows restricts by its denials only
        match = next((i for i, r in allows if _matches(r, action, resource)), None)
        if match is None:
            return Decision(False, "", f"no {name} rule allows {action} on {resource}")
        decided_by = decided_by or f"{name}[{match}]"
    return Decision(True, decided_by, "allowed by rule")


def covers(parent: pb.Agent, child_rules: Sequence[pb.PermissionRule]) -> str | None:
    """Why `child_rules` grant more than the parent's, or None when they are a subset."""
    parent_allows = [r for r in parent.permissions if r.effect == pb.PERMISSION_EFFECT_ALLOW]
    for index, rule in enumerate(child_rules):
        if rule.effect != pb.PERMISSION_EFFECT_ALLOW:
            continue
        resource = rule.resource or "*"
        if not any(
            fnmatchcase(rule.action, p.action) and fnmatchcase(resource, p.resource or "*")
            for p in parent_allows
        ):
            return f"permissions[{index}] allows {rule.action} on {resource}; the parent does not"
    return None
