"""The operators' commands against running services (with authentication on)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner
from switchboard_client import DeliveryClient, SessionClient

from switchboard.auth import parse_tokens
from switchboard_cli.main import main
from tests.harness import EventLoopThread, delivery_server, session_server

GRANTS = parse_tokens("root=admin")


def test_operator_commands(tmp_path: Path, loop_thread: EventLoopThread) -> None:
    url = f"sqlite:///{tmp_path / 'x.sqlite3'}"
    runner = CliRunner()
    with (
        session_server(loop_thread, url, auth=GRANTS) as session,
        delivery_server(loop_thread, url, auth=GRANTS) as delivery,
        SessionClient(session.address, token="root") as sessions,
        DeliveryClient(delivery.address, token="root") as ledger,
    ):
        sessions.create_agent("main")
        first = sessions.resolve("main", transport="web", conversation_id="tab").session

        def run(*args: str, answer: str | None = None) -> str:
            result = runner.invoke(
                main, [*args, "--token", "root"], input=answer, catch_exceptions=False
            )
            assert result.exit_code == 0, result.output
            return result.stdout

        address = ["--address", session.address]
        assert "main" in run("session", "agents", *address)
        shown = run("session", "agent", "main", *address)
        assert re.search(r"│ name\s+│ main\s+│", shown), "a table for people"
        assert json.loads(run("session", "agent", "main", *address, "-o", "json"))["name"] == "main"
        state = run("session", "show", "main", first.session_id, *address)
        assert re.search(r"│ routing key\s+│ agent:main:web:id=tab\s+│", state), state
        assert "routingKey" not in state and "{" not in state
        scripted = json.loads(run("session", "show", "main", first.session_id, *address,
                                  "--output", "json"))  # fmt: skip
        assert scripted["session"]["routing_key"] == "agent:main:web:id=tab", "snake_case fields"
        assert first.session_id in run("session", "sessions", "main", *address)
        assert "checkpoint before at sequence" in run("session", "checkpoint", "before", *address)
        later = sessions.resolve("main", transport="web", conversation_id="later").session
        declined = run("session", "rewind", "before", *address, answer="n\n")
        assert later.session_id in declined and "Go ahead?" in declined, "the preview first"
        assert "rewound to" not in declined
        assert len(list(sessions.list_sessions("main"))) == 2, "declined: nothing written"
        assert "rewound to" in run("session", "rewind", "before", *address, answer="y\n")
        assert len(list(sessions.list_sessions("main"))) == 1
        assert "nothing would change" in run("session", "rewind", "before", "--yes", *address)
        head = sessions.create_checkpoint("after").sequence
        restored = run("session", "checkout", str(later.create_sequence), "--yes", *address)
        assert later.session_id in restored and "checked out" in restored
        assert len(list(sessions.list_sessions("main"))) == 2
        assert sessions.create_checkpoint("again").sequence > head

        instance = ledger.register("gw", ["slack"])
        row = ledger.record(
            instance.instance_id, session_key="k", content="hi", platform="slack", chat_id="C1"
        ).obligation
        one = ["delivery", "obligation", row.id, "--address", delivery.address]
        assert re.search(rf"│ id\s+│ {row.id}\s+│", run(*one))
        assert json.loads(run(*one, "-o", "json"))["session_key"] == "k"
        listed = run("delivery", "obligations", "--address", delivery.address)
        assert "PENDING" in listed and "slack" in listed
        assert "PENDING" in run("delivery", "stats", "--address", delivery.address)
        moved = run("delivery", "hand-over", "--from", "gw", "--to", "gw2", "--id", row.id,
                    "--address", delivery.address)  # fmt: skip
        assert "handed 1 row(s) over from 'gw' to 'gw2'" in moved
        assert ledger.get(row.id).gateway_name == "gw2"
        assert row.id in run("delivery", "obligations", "--gateway", "gw2", "--address",
                             delivery.address)  # fmt: skip

        denied = runner.invoke(main, ["session", "agents", *address, "--token", "wrong"])
        assert denied.exit_code != 0 and "UNAUTHENTICATED" in denied.output
