"""Placeholder and weak secrets refuse to start the services (issue 21, item 12).

The manifests' own placeholder Secrets (k8s/*secret*.yaml, read here as
tests/deploy reads them) are fed to real `switchboard serve` processes: each exits
with code 2 and a message naming the setting and how to make a real secret, before
it opens its database (nothing is created there). The Postgres URL's placeholder
password is refused although the test cluster (trust authentication) would accept
any password: the placeholder would work, as the admin token did.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg2
import pytest
from click.testing import CliRunner

from session_service.pii import PiiKeyRefused, read_key
from switchboard import secret_checks
from switchboard.auth import check_secret, parse_tokens
from switchboard_cli.main import main
from tests.deploy.manifests import secrets
from tests.harness import postgres_schema, postgres_unreachable_reason

MANIFEST = secrets()
PLACEHOLDER_TOKENS = MANIFEST["switchboard-auth"]["tokens"]
PLACEHOLDER_PII_KEY = MANIFEST["switchboard-pii"]["key"]
PLACEHOLDER_DATABASE_URL = MANIFEST["switchboard-postgres"]["url"]
#: How long a process may take to exit once it refused (or was killed).
REFUSAL_TIMEOUT_S = 60.0


def _start(args: Sequence[str], env: dict[str, str]) -> tuple[int | None, str]:
    """Runs `switchboard ARGS`: its exit code (None when it started serving instead:
    then it is stopped) and what it wrote to stderr."""
    with tempfile.TemporaryFile("w+") as errors:
        process = subprocess.Popen(
            [sys.executable, "-m", "switchboard_cli", "--log-format", "text", *args],
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            env={"PATH": "/usr/bin:/bin", **env},
        )
        assert process.stdout is not None
        started = any("ready;" in line for line in process.stdout)  # until it exits or serves
        if started:
            process.kill()
        code = process.wait(timeout=REFUSAL_TIMEOUT_S)
        errors.seek(0)
        return None if started else code, errors.read()


def _serve(which: str, database_url: str, env: dict[str, str]) -> tuple[int | None, str]:
    return _start(
        ["serve", which, f"--{which}-listen", "127.0.0.1:0", f"--{which}-database-url",
         database_url],
        env,
    )  # fmt: skip


def _tables(database_url: str) -> int:
    """How many tables the database holds (0 for a SQLite file never created)."""
    if database_url.startswith("sqlite:///"):
        path = Path(database_url.removeprefix("sqlite:///"))
        if not path.exists():
            return 0
        with sqlite3.connect(path) as connection:
            return int(connection.execute("SELECT count(*) FROM sqlite_master").fetchone()[0])
    with psycopg2.connect(database_url) as connection, connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema()"
        )
        row = cursor.fetchone()
        assert row is not None
        return int(row[0])


@pytest.mark.parametrize("which", ["session", "delivery"])
def test_the_manifests_placeholder_tokens_refuse_to_start(database_url: str, which: str) -> None:
    code, said = _serve(which, database_url, {"SWITCHBOARD_AUTH_TOKENS": PLACEHOLDER_TOKENS})
    assert code == 2, said
    assert "--auth-tokens / SWITCHBOARD_AUTH_TOKENS" in said
    assert "auth token 1 (scope admin) is not a secret" in said and "'changeme'" in said
    assert "openssl rand" in said, "it says how to make a real one"
    assert "CHANGE-ME-ADMIN" not in said, "a token is never printed"
    assert _tables(database_url) == 0, "refused before opening the database"


def test_a_short_token_refuses_to_start(database_url: str) -> None:
    tokens = "a-real-token-of-enough-length=admin;gw-token=gateway:bot:main"
    code, said = _serve("session", database_url, {"SWITCHBOARD_AUTH_TOKENS": tokens})
    assert code == 2, said
    assert "auth token 2 (scope gateway:bot:main) is not a secret" in said
    assert "8 characters long; it must have at least 16" in said
    assert _tables(database_url) == 0


@pytest.mark.parametrize(
    "key",
    [PLACEHOLDER_PII_KEY, "CHANGE-ME-CHANGE-ME-CHANGE-ME", "please-change_me-before-use"],
    ids=["the manifest's", "a long placeholder", "a lower-case placeholder"],
)
def test_placeholder_pii_keys_refuse_to_start(database_url: str, key: str) -> None:
    code, said = _serve("session", database_url, {"SWITCHBOARD_PII_KEY": key})
    assert code == 2, said
    assert "--pii-key-file / SWITCHBOARD_PII_KEY" in said
    assert "placeholder" in said or "must be at least 16" in said
    assert key not in said, "the key is never printed"
    assert _tables(database_url) == 0


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh Postgres schema (a database password is a Postgres setting only)."""
    reason = postgres_unreachable_reason()
    if reason:
        pytest.skip(reason)
    with postgres_schema() as url:
        yield url


def _with_password(url: str, password: str) -> str:
    parts = urlsplit(url)
    netloc = f"{parts.username}:{password}@{parts.hostname}:{parts.port or 5432}"
    return urlunsplit(parts._replace(netloc=netloc))


@pytest.mark.postgres
@pytest.mark.parametrize("which", ["session", "delivery"])
def test_the_manifests_database_password_refuses_to_start(postgres_url: str, which: str) -> None:
    """The manifest's placeholder password, on a cluster (trust authentication) that
    would take any password: without the check the service would start."""
    placeholder = urlsplit(PLACEHOLDER_DATABASE_URL).password
    assert placeholder == "CHANGE-ME"
    with_placeholder = _with_password(postgres_url, placeholder)
    variable = f"SWITCHBOARD_{which.upper()}_DATABASE_URL"
    code, said = _start(
        ["serve", which, f"--{which}-listen", "127.0.0.1:0"], {variable: with_placeholder}
    )
    assert code == 2, said
    assert f"'--{which}-database-url' (env var: '{variable}')" in said
    assert "placeholder" in said and "CHANGE-ME" not in said
    assert _tables(postgres_url) == 0
    migrate = CliRunner().invoke(main, ["db", "migrate", which], env={variable: with_placeholder})
    assert migrate.exit_code == 2 and "not a secret" in migrate.output
    assert _tables(postgres_url) == 0


def test_an_operator_token_that_is_a_placeholder_is_not_sent() -> None:
    refused = CliRunner().invoke(
        main,
        ["session", "agents", "--address", "127.0.0.1:1"],
        env={"SWITCHBOARD_TOKEN": "CHANGE-ME-ADMIN"},
    )
    assert refused.exit_code == 2 and "placeholder" in refused.output
    assert "UNAVAILABLE" not in refused.output, "refused before any call"


# -- the rules ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "says"),
    [
        ("CHANGE-ME-ADMIN", "placeholder (it contains 'changeme')"),
        ("my-Change_Me-token-0123456789", "placeholder (it contains 'changeme')"),
        ("REPLACE-ME-WITH-A-REAL-TOKEN", "placeholder (it contains 'replaceme')"),
        ("token-placeholder-0123456789", "placeholder (it contains 'placeholder')"),
        ("Password", "well-known default"),
        ("ops-token", "9 characters long; it must have at least 16"),
        ("abababababababababab", "2 distinct characters"),
    ],
)
def test_tokens_that_are_no_secret_are_refused(token: str, says: str) -> None:
    with pytest.raises(ValueError, match=r"auth token 2 \(scope agents:main\)") as refused:
        check_secret(parse_tokens(f"4f1c9e0b7d2a6e8f3b5c1d9a7e2f4b6c=admin;{token}=agents:main"))
    assert says in str(refused.value) and token not in str(refused.value)


def test_random_tokens_and_keys_pass() -> None:
    check_secret(parse_tokens("4f1c9e0b7d2a6e8f3b5c1d9a7e2f4b6c=admin;probe-test-admin=admin"))
    assert secret_checks.weakness("s3cr3t-Db-pässwörd") is None
    random_bytes = bytes(range(7, 39))
    assert read_key(None, random_bytes.decode("latin-1")) is not None


def test_placeholder_pii_keys_are_refused_before_use(tmp_path: Path) -> None:
    written = tmp_path / "key"
    written.write_text("CHANGE-ME-CHANGE-ME-CHANGE-ME\n")
    with pytest.raises(PiiKeyRefused, match="placeholder"):
        read_key(written, None)
    with pytest.raises(PiiKeyRefused, match="distinct characters"):
        read_key(None, "0" * 32)
