"""The operators' commands against running services (with authentication on)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner
from switchboard_client import DeliveryClient, SessionClient

from switchboard.auth import parse_tokens
from switchboard.cli import main
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

        def run(*args: str) -> str:
            result = runner.invoke(main, [*args, "--token", "root"], catch_exceptions=False)
            assert result.exit_code == 0, result.output
            return result.output

        address = ["--address", session.address]
        assert "main" in run("session", "agents", *address)
        assert '"name": "main"' in run("session", "agent", "main", *address)
        assert '"routingKey": "agent:main:web:tab"' in run(
            "session", "show", "main", first.session_id, *address
        )
        assert first.session_id in run("session", "sessions", "main", *address)
        assert "checkpoint before at sequence" in run("session", "checkpoint", "before", *address)
        sessions.resolve("main", transport="web", conversation_id="later")
        assert "rewound to" in run("session", "rewind", "before", *address)
        assert len(list(sessions.list_sessions("main"))) == 1

        instance = ledger.register("gw", ["slack"])
        row = ledger.record(
            instance.instance_id, session_key="k", content="hi", platform="slack", chat_id="C1"
        ).obligation
        assert f'"id": "{row.id}"' in run("delivery", "obligation", row.id, "--address",
                                          delivery.address)  # fmt: skip
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
