"""`switchboard serve` as people run it: access lines without --metrics-listen, their
quieter levels, --log-format on `serve` and through `python3 dev.py serve`, and every
option's environment variable in --help."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from switchboard_client import SessionClient, SwitchboardError

from switchboard_cli.main import main
from tests.harness import _LISTENING

ROOT = Path(__file__).resolve().parents[1]
AGENTS = "/switchboard.session.v1.SessionService/ListAgents"
GET_AGENT = "/switchboard.session.v1.SessionService/GetAgent"


@contextmanager
def _served(tmp_path: Path, *options: str, dev: bool = False) -> Iterator[tuple[str, Path]]:
    """`switchboard serve session` (or `python3 dev.py serve session`) as a child
    process; yields its address and the file its stderr goes to (complete once the
    block has ended: the process is stopped with SIGTERM and waited for)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    log = tmp_path / "stderr.log"
    url = f"sqlite:///{tmp_path / 's.sqlite3'}"
    served = ["session", "--session-listen", "127.0.0.1:0", "--session-database-url", url]
    argv = (
        [sys.executable, str(ROOT / "dev.py"), "serve", *served, *options]
        if dev
        else [sys.executable, "-m", "switchboard_cli", "serve", *served, *options]
    )
    with log.open("w") as errors:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errors, text=True)
    assert process.stdout is not None
    try:
        address = ""
        for line in process.stdout:
            if match := _LISTENING.search(line):
                address = match.group(2)
                break
        assert address, f"no listening line; stderr:\n{log.read_text()}"
        yield address, log
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


def _access_lines(log: Path) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("logger") == "switchboard.access"]


def _calls(address: str, token: str | None = None) -> None:
    with SessionClient(address, token=token) as client:
        list(client.list_agents())
        with pytest.raises(SwitchboardError):
            client.get_agent("nobody")


def test_every_call_is_logged_as_json_by_default_without_metrics(tmp_path: Path) -> None:
    with _served(tmp_path, "--auth-tokens", "ops-token-0123456789=admin") as (address, log):
        _calls(address, token="ops-token-0123456789")
    lines = _access_lines(log)
    by_method = {line["method"]: line for line in lines}
    assert set(by_method) == {AGENTS, GET_AGENT}, lines
    assert by_method[AGENTS]["status"] == "OK"
    assert by_method[GET_AGENT]["status"] == "NOT_FOUND"
    for line in lines:
        assert line["principal"] == "admin"
        assert isinstance(line["duration_ms"], float) and line["duration_ms"] >= 0
        assert re.fullmatch(r"[0-9a-f-]{8,64}", str(line["request_id"])), line
        assert line["level"] == "INFO"


def test_access_log_errors_only_and_off(tmp_path: Path) -> None:
    with _served(tmp_path / "errors", "--access-log", "errors") as (address, log):
        _calls(address)
    assert [(line["method"], line["status"]) for line in _access_lines(log)] == [
        (GET_AGENT, "NOT_FOUND")
    ]
    with _served(tmp_path / "off", "--access-log", "off") as (address, log):
        _calls(address)
    assert _access_lines(log) == []


@pytest.mark.parametrize("dev", [False, True], ids=["switchboard serve", "dev.py serve"])
def test_log_format_text_on_serve(tmp_path: Path, dev: bool) -> None:
    with _served(tmp_path, "--log-format", "text", dev=dev) as (address, log):
        _calls(address)
    said = log.read_text()
    assert not [line for line in said.splitlines() if line.startswith("{")], said
    assert re.search(rf"INFO switchboard.access: rpc {AGENTS} OK [0-9.]+ ms request_id=", said)


def _options(command: click.Command) -> Iterator[click.Option]:
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden and param.name != "help":
            yield param


def test_every_option_shows_its_environment_variable() -> None:
    runner = CliRunner()
    serve = main.commands["serve"]
    shown = runner.invoke(main, ["serve", "--help"], terminal_width=200).output
    flat = " ".join(shown.split())
    for option in _options(serve):
        assert option.envvar, f"{option.name} has no environment variable"
        assert f"env var: {option.envvar}" in flat, option.name
    assert "SWITCHBOARD_PII_KEY" in flat, "the hidden --pii-key is named in --pii-key-file's help"
    top = " ".join(runner.invoke(main, ["--help"], terminal_width=200).output.split())
    for variable in ("SWITCHBOARD_TOKEN", "SWITCHBOARD_SESSION_ADDRESS",
                     "SWITCHBOARD_DELIVERY_ADDRESS"):  # fmt: skip
        assert variable in top
    for group in ("session", "delivery", "log", "agent", "db"):
        for name, command in main.commands[group].commands.items():  # type: ignore[attr-defined]
            text = " ".join(
                runner.invoke(main, [group, name, "--help"], terminal_width=200).output.split()
            )
            for option in _options(command):
                if option.envvar:
                    assert f"env var: {option.envvar}" in text, (group, name, option.name)


def test_operator_commands_read_the_token_and_address_from_the_environment(
    tmp_path: Path,
) -> None:
    with _served(tmp_path, "--auth-tokens", "env-token-0123456789=admin") as (address, _log):
        env = {"SWITCHBOARD_SESSION_ADDRESS": address, "SWITCHBOARD_TOKEN": "env-token-0123456789"}
        answer = CliRunner().invoke(main, ["session", "agents"], env=env)
        assert answer.exit_code == 0, answer.output
        wrong = {**env, "SWITCHBOARD_TOKEN": "no"}
        refused = CliRunner().invoke(main, ["session", "agents"], env=wrong)
        assert refused.exit_code != 0 and "UNAUTHENTICATED" in refused.output
