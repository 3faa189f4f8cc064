"""The operators' reading commands against running services: a session's history,
the log's tail (and --follow), obligations by state with a limit, gateway
instances; `rebuild` on a missing file and its progress."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from switchboard_client import DeliveryClient, SessionClient

from switchboard.auth import parse_tokens
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard_cli.main import main
from tests.harness import EventLoopThread, delivery_server, session_server

GRANTS = parse_tokens("ops=admin;main-only=agents:main")


@dataclass
class Services:
    session: str
    delivery: str
    sessions: SessionClient
    ledger: DeliveryClient

    def run(self, *args: str, token: str = "ops", ok: bool = True) -> str:
        """What the command printed (stdout; with `ok` False, its error too). The
        servers share this process: WARNING keeps their access lines out."""
        argv = ["--log-level", "WARNING", *args, "--token", token]
        result = CliRunner().invoke(main, argv, catch_exceptions=False)
        assert (result.exit_code == 0) == ok, result.output
        return result.stdout if ok else result.output


@pytest.fixture
def services(database_url: str, loop_thread: EventLoopThread) -> Iterator[Services]:
    with (
        session_server(loop_thread, database_url, auth=GRANTS) as session,
        delivery_server(loop_thread, database_url, auth=GRANTS) as delivery,
        SessionClient(session.address, token="ops") as sessions,
        DeliveryClient(delivery.address, token="ops") as ledger,
    ):
        sessions.create_agent("main")
        yield Services(session.address, delivery.address, sessions, ledger)


def test_session_history_pages(services: Services) -> None:
    session_id = services.sessions.resolve("main", transport="web", conversation_id="t").session
    for number in range(5):
        services.sessions.append_message("main", session_id.session_id, pb.ROLE_USER, f"m{number}")
    where = [session_id.session_id, "--address", services.session]
    newest = services.run("session", "history", "main", *where, "--limit", "2")
    assert "m3" in newest and "m4" in newest and "m2" not in newest
    token = re.search(r"older messages: .* --page-token (\S+)", newest)
    assert token, newest
    older = services.run("session", "history", "main", *where, "--limit", "2",
                         "--page-token", token.group(1))  # fmt: skip
    assert "m1" in older and "m2" in older and "m4" not in older
    oldest = services.run("session", "history", "main", *where, "--limit", "2", "--oldest")
    assert "m0" in oldest and "m1" in oldest and "newer messages:" in oldest
    everything = services.run("session", "history", "main", *where, "--limit", "2", "--all",
                              "--json")  # fmt: skip
    contents = re.findall(r'"content": "(m\d)"', everything)
    assert contents == ["m0", "m1", "m2", "m3", "m4"], "every page, oldest message first"
    scoped = services.run("session", "history", "main", *where, token="main-only")
    assert "m4" in scoped, "an agent token reads its agent's history"


def test_log_tail_and_follow(services: Services) -> None:
    made = services.sessions.resolve("main", transport="web", conversation_id="t").session
    for number in range(30):
        services.sessions.append_message("main", made.session_id, pb.ROLE_USER, f"line {number}")
    tail = services.run("log", "tail", "-n", "3", "--address", services.session)
    assert [re.search(r'"content": "(line \d+)"', line).group(1)  # type: ignore[union-attr]
            for line in tail.splitlines()] == ["line 27", "line 28", "line 29"]  # fmt: skip
    assert services.run("log", "tail", "-n", "1", "--agent", "nobody",
                        "--address", services.session) == ""  # fmt: skip

    for later, (token, lines) in enumerate((("ops", "1"), ("main-only", "0")), start=1):
        follow = subprocess.Popen(
            [sys.executable, "-m", "switchboard_cli", "--log-level", "WARNING", "log", "tail",
             "-n", lines, "--follow", "--agent", "main", "--address", services.session,
             "--token", token],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            # Ctrl-C as at a terminal, even when the suite runs in a background job
            # (whose processes inherit SIGINT ignored).
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
        assert follow.stdout is not None and follow.stderr is not None
        try:
            first = follow.stdout.readline()
            if token == "ops":
                assert "line 29" in first, first + follow.stderr.read()
            else:  # an agent token follows its agent from the first event
                assert "agent_created" in first or "session" in first, first
                while "line 29" not in first:
                    first = follow.stdout.readline()
                    assert first, follow.stderr.read()
            services.sessions.append_message("main", made.session_id, pb.ROLE_USER,
                                             f"written later {later}")  # fmt: skip
            while f"written later {later}" not in (line := follow.stdout.readline()):
                assert line, follow.stderr.read()
        finally:
            follow.send_signal(signal.SIGINT)
            follow.wait(timeout=60)
        assert "Traceback" not in follow.stderr.read()


def test_obligations_by_state_with_a_limit_and_no_stale_error(services: Services) -> None:
    ledger = services.ledger
    instance = ledger.register("gw", ["slack"]).instance_id
    rows = [
        ledger.record(instance, session_key="agent:main:k", content=f"r{n}", platform="slack",
                      chat_id="C1", message_ref=f"m{n}").obligation
        for n in range(4)
    ]  # fmt: skip
    ledger.abandon(rows[0].id, "wrong chat")
    ledger.retry(rows[0].id)
    claimed = ledger.claim_recoverable(instance).obligations
    assert [row.id for row in claimed] == [rows[0].id]
    delivered = ledger.mark_delivered(instance, claimed[0], "pm-1")
    assert delivered.last_error == "", "a delivered row has no last error"
    address = ["--address", services.delivery]
    listed = services.run("delivery", "obligations", "--state", "delivered", *address)
    assert rows[0].id in listed and "abandoned by operator" not in listed
    assert rows[1].id not in listed
    pending = services.run("delivery", "obligations", "--state", "pending", "--limit", "2",
                           *address)  # fmt: skip
    assert rows[1].id in pending and rows[2].id in pending and rows[3].id not in pending
    assert "more rows match: raise --limit" in pending
    every = services.run("delivery", "obligations", "--limit", "4", *address)
    assert all(row.id in every for row in rows) and "more rows match" not in every


def test_delivery_instances(services: Services) -> None:
    ledger = services.ledger
    live = ledger.register("gw-live", ["slack", "telegram"]).instance_id
    gone = ledger.register("gw-gone", ["slack"]).instance_id
    for number in range(2):
        ledger.record(live, session_key="agent:main:k", content=f"owed {number}",
                      platform="slack", chat_id="C1", message_ref=f"m{number}")  # fmt: skip
    ledger.deregister(gone)
    address = ["--address", services.delivery]
    shown = services.run("delivery", "instances", *address)
    row_of = {
        instance_id: next(line for line in shown.splitlines() if instance_id[:8] in line)
        for instance_id in (live, gone)
    }
    assert "slack,telegram" in row_of[live] and "yes" in row_of[live]
    assert re.search(r"\b2\b", row_of[live]), "two owed rows held"
    assert "deregistered" in row_of[gone]
    only_live = services.run("delivery", "instances", "--live", *address)
    assert live[:8] in only_live and gone[:8] not in only_live
    one = services.run("delivery", "instances", "--limit", "1", *address)
    assert gone[:8] in one and live[:8] not in one, "the latest registered first"
    assert "more instances match" in one
    denied = services.run("delivery", "instances", *address, token="main-only", ok=False)
    assert "PERMISSION_DENIED" in denied


def test_rebuild_refuses_a_missing_database(tmp_path: Path) -> None:
    missing = tmp_path / "elsewhere"
    result = CliRunner().invoke(main, ["session", "rebuild", "--data-dir", str(missing)])
    assert result.exit_code != 0
    assert f"no session database at {missing / 'session.sqlite3'}" in result.output
    assert not missing.exists(), "nothing was created"


def test_rebuild_progress_ends_at_100_percent(tmp_path: Path, loop_thread: EventLoopThread) -> None:
    url = f"sqlite:///{tmp_path / 'session.sqlite3'}"
    with session_server(loop_thread, url) as served, SessionClient(served.address) as client:
        client.create_agent("main")
        made = client.resolve("main", transport="web", conversation_id="t").session
        for number in range(8):
            client.append_message("main", made.session_id, pb.ROLE_USER, f"m{number}")
        checkpoint = client.create_checkpoint("half").sequence
        for number in range(8):
            client.append_message("main", made.session_id, pb.ROLE_USER, f"later {number}")
        client.rewind(checkpoint)  # the later events are abandoned: counted, not replayed
    result = CliRunner().invoke(
        main, ["--log-level", "WARNING", "session", "rebuild", "--data-dir", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert "100%" in result.output and "replayed" in result.output
    assert not re.search(r"\b[1-9]?\d%", result.output.replace("100%", "")), result.output


def test_rewind_preview_names_what_it_abandons(services: Services) -> None:
    before = services.sessions.create_checkpoint("before").sequence
    later = services.sessions.resolve("main", transport="web", conversation_id="later").session
    services.sessions.append_message("main", later.session_id, pb.ROLE_USER, "to abandon")
    address = ["--address", services.session]
    declined = CliRunner().invoke(
        main,
        ["--log-level", "WARNING", "session", "rewind", str(before), *address, "--token", "ops"],
        input="n\n",
    )
    assert later.session_id in declined.output and "abandoned" in declined.output
    assert "Go ahead?" in declined.output and "rewound to" not in declined.output
    assert services.sessions.history("main", later.session_id), "declined: nothing changed"
    done = services.run("session", "rewind", str(before), "--yes", *address)
    assert "rewound to" in done and "Go ahead?" not in done


def test_the_empty_log_and_the_rows_of_no_gateway_are_asked_for_by_flag(
    services: Services,
) -> None:
    """A 0 or an empty --from (a script's unset variable, say) moves nothing: the
    operator says what they mean with --empty-log or --from-no-gateway."""
    sessions, address = services.sessions, ["--address", services.session]
    head = list(sessions.list_log_events())[-1].event.sequence
    for move in ("checkout", "rewind"):
        refused = services.run("session", move, "0", "--yes", *address, ok=False)
        assert "sequence 0 is the empty log" in refused and "--empty-log" in refused
        wrong = services.run("session", move, str(head), "--empty-log", "--yes", *address, ok=False)
        assert "--empty-log goes with sequence 0 only" in wrong
    assert list(sessions.list_log_events())[-1].event.sequence == head, "nothing written"
    emptied = services.run("session", "checkout", "0", "--empty-log", "--yes", *address)
    assert "checked out 0" in emptied and list(sessions.list_agents()) == []
    services.run("session", "checkout", str(head), "--yes", *address)
    assert [agent.name for agent in sessions.list_agents()] == ["main"]

    ledger = ["--address", services.delivery]
    unnamed = services.run("delivery", "hand-over", "--from", "", "--to", "gw2", *ledger, ok=False)
    assert "--from NAME, or --from-no-gateway" in unnamed
    moved = services.run("delivery", "hand-over", "--from-no-gateway", "--to", "gw2", *ledger)
    assert "handed 0 row(s) over from no gateway to 'gw2'" in moved
