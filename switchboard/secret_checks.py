"""Secrets refused at start when they are placeholders or obviously weak.

The manifests ship placeholder Secrets (`k8s/auth-secret.yaml`'s
`CHANGE-ME-ADMIN=admin`, `k8s/pii-secret.yaml`, the password of
`k8s/postgres/secret.yaml`'s URL): a deployment that forgot to replace one would
otherwise run with a credential anyone can read in this repository. So every secret
a process is configured with is held to the same rules here, and `switchboard
serve` (and the commands that read a database URL or a token) exit with a message
naming the setting instead of starting.

The rules are deliberately few and mechanical, for machine-generated secrets: no
placeholder word in any case or spelling (`CHANGE-ME`, `change_me`, `ChangeMe`,
`REPLACE-ME`, `placeholder`), none of a handful of well-known default passwords,
and, where the secret's length is ours to decide (tokens, the PII key), a minimum
length and more than a few distinct characters. A strength meter for passwords
people choose (zxcvbn) would refuse the test suites' readable tokens and says
nothing more about a random one.
"""

from __future__ import annotations

import re

#: Words that mark a value as a placeholder, compared without case or separators
#: ("CHANGE-ME-ADMIN" and "change_me" both contain "changeme").
PLACEHOLDER_WORDS = ("changeme", "replaceme", "placeholder")
#: Whole values that are well-known defaults, not secrets (compared without case).
DEFAULT_SECRETS = frozenset({"admin", "password", "postgres", "secret", "switchboard", "test"})
#: The shortest bearer token accepted: `openssl rand -hex 32` gives 64 characters.
MIN_TOKEN_CHARS = 16
#: Fewer distinct characters than this is a repeated pattern, not a random value.
MIN_DISTINCT_CHARS = 6
#: How to make a real secret, for every refusal's message.
MAKE_ONE = "make a random one, e.g. with `openssl rand -hex 32`"

_SEPARATORS = re.compile(r"[\W_]+")


def placeholder_word(value: str) -> str | None:
    """The placeholder word `value` contains (in any case, with any separators), or None."""
    squeezed = _SEPARATORS.sub("", value).lower()
    return next((word for word in PLACEHOLDER_WORDS if word in squeezed), None)


def weakness(value: str, *, min_chars: int = 0) -> str | None:
    """Why `value` is no real secret (never quoting it), or None.

    `min_chars` 0 checks only what a secret of any length must not be (a placeholder,
    a default); otherwise the value must also be that long and not a repeated pattern.
    """
    word = placeholder_word(value)
    if word is not None:
        return f"it is a placeholder (it contains {word!r})"
    if value.lower() in DEFAULT_SECRETS:
        return "it is a well-known default, not a secret"
    if min_chars and len(value) < min_chars:
        return f"it is {len(value)} characters long; it must have at least {min_chars}"
    if min_chars and len(set(value)) < MIN_DISTINCT_CHARS:
        return (
            f"it has {len(set(value))} distinct characters; a random value has at least "
            f"{MIN_DISTINCT_CHARS}"
        )
    return None
