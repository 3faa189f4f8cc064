"""One output convention: tables for people, `--output json` (one JSON object per
line, the .proto's snake_case names) for scripts, on every command that prints data;
and `switchboard agent create|list|show`. Against real services on SQLite and
PostgreSQL, through the real command."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import click
import pytest
from click.testing import CliRunner
from switchboard_client import DeliveryClient, SessionClient

from switchboard.auth import parse_tokens
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard_cli.main import main
from tests.harness import EventLoopThread, delivery_server, session_server

GRANTS = parse_tokens("output-admin=admin")
#: The commands that print no data: they run something (or ask a person).
NOT_DATA = {"serve", "chat", "gateway", "console"}


@dataclass
class Deployment:
    session: str
    delivery: str
    database_url: str
    session_id: str
    obligation_id: str

    def run(self, *args: str, ok: bool = True, answer: str | None = None) -> Any:
        env = {
            "SWITCHBOARD_TOKEN": "output-admin",
            "SWITCHBOARD_SESSION_ADDRESS": self.session,
            "SWITCHBOARD_DELIVERY_ADDRESS": self.delivery,
        }
        result = CliRunner().invoke(main, ["--log-level", "ERROR", *args], env=env, input=answer)
        assert (result.exit_code == 0) == ok, result.output
        return result


@pytest.fixture
def deployment(database_url: str, loop_thread: EventLoopThread) -> Iterator[Deployment]:
    with (
        session_server(loop_thread, database_url, auth=GRANTS) as session,
        delivery_server(loop_thread, database_url, auth=GRANTS) as delivery,
        SessionClient(session.address, token="output-admin") as sessions,
        DeliveryClient(delivery.address, token="output-admin") as ledger,
    ):
        sessions.create_agent("main", memory={"tone": "dry"})
        made = sessions.resolve("main", transport="web", conversation_id="t").session
        sessions.append_message("main", made.session_id, pb.ROLE_USER, "hello")
        sessions.post_to_inbox(
            "main", made.session_id, pb.Message(role=pb.ROLE_USER, content="waiting")
        )
        sessions.create_checkpoint("first")
        instance = ledger.register("gw", ["slack"]).instance_id
        row = ledger.record(
            instance, session_key="agent:main:k", content="hi", platform="slack", chat_id="C1"
        ).obligation
        yield Deployment(session.address, delivery.address, database_url, made.session_id, row.id)


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _commands(command, (*prefix, name))
        elif name not in NOT_DATA:
            yield (*prefix, name)


def test_every_command_that_prints_data_takes_output() -> None:
    missing = [" ".join(path) for path in _commands(main) if not _takes_output(path)]
    assert missing == []


def _takes_output(path: tuple[str, ...]) -> bool:
    command: click.Command = main
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return any(param.name == "output" for param in command.params)


def _snake_case_keys(value: Any, where: str = "") -> list[str]:
    """Field names that are not snake_case (map keys are data: skipped)."""
    if isinstance(value, list):
        return [bad for item in value for bad in _snake_case_keys(item, where)]
    if not isinstance(value, dict):
        return []
    bad = []
    for key, item in value.items():
        if key in ("memory", "temp_state", "metadata", "differences"):
            continue
        if not re.fullmatch(r"[a-z0-9_]+", key):
            bad.append(f"{where}{key}")
        bad += _snake_case_keys(item, f"{where}{key}.")
    return bad


def _json_lines(text: str) -> list[Any]:
    lines = text.splitlines()
    assert lines, "printed nothing"
    return [json.loads(line) for line in lines]


def test_every_data_command_prints_snake_case_json_lines(deployment: Deployment) -> None:
    d, url = deployment, deployment.database_url
    urls = ["--session-database-url", url, "--delivery-database-url", url]
    printed = {
        "agent list": d.run("agent", "list", "-o", "json"),
        "agent show": d.run("agent", "show", "main", "-o", "json"),
        "agent create": d.run("agent", "create", "second", "--display-name", "Two", "-o", "json"),
        "session agents": d.run("session", "agents", "-o", "json"),
        "session agent": d.run("session", "agent", "main", "-o", "json"),
        "session show": d.run("session", "show", "main", d.session_id, "-o", "json"),
        "session sessions": d.run("session", "sessions", "main", "-o", "json"),
        "session checkpoint": d.run("session", "checkpoint", "second", "-o", "json"),
        "session checkpoints": d.run("session", "checkpoints", "-o", "json"),
        "session log": d.run("session", "log", "-o", "json"),
        "session history": d.run("session", "history", "main", d.session_id, "-o", "json"),
        "session rewind": d.run("session", "rewind", "first", "--yes", "-o", "json"),
        "session checkout": d.run("session", "checkout", "1", "--yes", "-o", "json"),
        "log tail": d.run("log", "tail", "-n", "3", "-o", "json"),
        "delivery obligations": d.run("delivery", "obligations", "-o", "json"),
        "delivery obligation": d.run("delivery", "obligation", d.obligation_id, "-o", "json"),
        "delivery instances": d.run("delivery", "instances", "-o", "json"),
        "delivery stats": d.run("delivery", "stats", "-o", "json"),
        "delivery hand-over": d.run(
            "delivery", "hand-over", "--from", "gw", "--to", "gw2", "-o", "json"
        ),
        "delivery abandon": d.run("delivery", "abandon", d.obligation_id, "-o", "json"),
        "delivery retry": d.run("delivery", "retry", d.obligation_id, "-o", "json"),
        "delivery prune": d.run("delivery", "prune", "-o", "json"),
        "db migrate": d.run("db", "migrate", *urls, "-o", "json"),
        "db status": d.run("db", "status", *urls, "-o", "json"),
        "session rebuild": d.run("session", "rebuild", "--database-url", url, "-o", "json"),
        "session key-report": d.run(
            "session", "key-report", "--database-url", url, "--all", "-o", "json"
        ),
    }
    every = {" ".join(path) for path in _commands(main)}
    assert every - set(printed) == set(), "a data command this test does not run"
    # A fresh database's routing-key report lists no session: no lines at all.
    assert printed.pop("session key-report").stdout == ""
    parsed = {name: _json_lines(result.stdout) for name, result in printed.items()}
    for name, records in parsed.items():
        assert _snake_case_keys(records) == [], name
    assert parsed["session show"][0]["session"]["routing_key"] == "agent:main:web:id=t"
    assert [m["message"]["content"] for m in parsed["session history"]] == ["hello"]
    assert parsed["session show"][0]["inbox"][0]["message"]["content"] == "waiting"
    assert parsed["agent show"][0]["memory"] == {"tone": "dry"}
    assert parsed["delivery obligation"][0]["id"] == d.obligation_id
    assert parsed["delivery hand-over"] == [{"handed_over_count": 1}]
    assert [row["component"] for row in parsed["db status"]] == ["session", "delivery"]
    assert parsed["session rebuild"][0]["events"] > 0
    # A rewind's preview comes first, then the record it wrote.
    preview, record = parsed["session rewind"]
    assert preview["to_sequence"] == record["rewound"]["to_sequence"]


def test_tables_for_people(deployment: Deployment) -> None:
    d = deployment
    shown = d.run("session", "show", "main", d.session_id).stdout
    assert re.search(r"│ routing key\s+│ agent:main:web:id=t\s+│", shown)
    assert re.search(r"│ inbox\s+│ \d+ user: waiting\s+│", shown)
    assert "{" not in shown, "no JSON for people"
    agent = d.run("agent", "show", "main").stdout
    assert re.search(r"│ memory\s+│ tone: dry\s+│", agent)
    assert re.search(r"│ settings\s+│ defaults\s+│", agent)
    row = d.run("delivery", "obligation", d.obligation_id).stdout
    assert re.search(r"│ state\s+│ PENDING\s+│", row) and "{" not in row


def test_agent_create_with_its_settings_and_list_by_pages(deployment: Deployment) -> None:
    d = deployment
    made = d.run(
        "agent", "create", "helper", "--display-name", "Helper", "--parent", "main",
        "--workspace-root", "/work/helper", "--redact-pii",
        "--shared-group-sessions", "--resume-window", "90", "--reset-idle-after", "600",
    ).stdout  # fmt: skip
    assert re.search(r"│ parent\s+│ main\s+│", made)
    with SessionClient(d.session, token="output-admin") as sessions:
        stored = sessions.get_agent("helper")
    assert (stored.display_name, stored.parent, stored.workspace_root) == (
        "Helper", "main", "/work/helper",
    )  # fmt: skip
    assert stored.settings.redact_pii
    assert stored.settings.routing.shared_group_sessions
    assert stored.settings.resume.freshness_window.seconds == 90
    assert stored.settings.reset.mode == pb.RESET_MODE_IDLE
    assert stored.settings.reset.idle_after.seconds == 600
    assert "redact_pii: yes" in d.run("agent", "show", "helper").stdout

    d.run("agent", "create", "daily", "--peer", "main", "--reset-daily-at-hour", "4",
          "--never-resume")  # fmt: skip
    with SessionClient(d.session, token="output-admin") as sessions:
        daily = sessions.get_agent("daily")
    assert list(daily.peers) == ["main"] and daily.settings.resume.never_resume
    assert (daily.settings.reset.mode, daily.settings.reset.daily_at_hour) == (
        pb.RESET_MODE_DAILY, 4,
    )  # fmt: skip
    assert "more agents: raise --limit (it is 2)" in d.run("agent", "list", "--limit", "2").stdout
    page = d.run("agent", "list", "--limit", "2", "-o", "json")
    assert [agent["name"] for agent in _json_lines(page.stdout)] == ["daily", "helper"]
    assert "more agents" in page.stderr, "scripts read stdout: the note goes to stderr"
    every = _json_lines(d.run("agent", "list", "-o", "json").stdout)
    assert [agent["name"] for agent in every] == ["daily", "helper", "main"]


def test_agent_create_refuses_bad_input_and_writes_nothing(deployment: Deployment) -> None:
    d = deployment
    clash = d.run("agent", "create", "x", "--reset-idle-after", "60",
                  "--reset-daily-at-hour", "3", ok=False)  # fmt: skip
    assert clash.exit_code == 2 and "idle or daily, not both" in clash.output
    named = d.run("agent", "create", "Not A Name", ok=False)
    assert named.exit_code == 1 and "Error: INVALID_ARGUMENT" in named.output
    orphan = d.run("agent", "create", "orphan", "--parent", "nobody", ok=False)
    assert orphan.exit_code == 1 and "nobody" in orphan.output
    again = d.run("agent", "create", "main", ok=False)
    assert "Error: ALREADY_EXISTS" in again.output and "Traceback" not in again.output
    with SessionClient(d.session, token="output-admin") as sessions:
        assert [agent.name for agent in sessions.list_agents()] == ["main"]
