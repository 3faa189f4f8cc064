"""`switchboard chat` driven as a person would: in a real terminal (a pty), against
real services with authentication on, with a callback module from the current
directory."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from switchboard_client import SessionClient

from switchboard.auth import parse_tokens
from tests.harness import EventLoopThread, delivery_server, session_server

ROOT = Path(__file__).resolve().parents[1]
GRANTS = parse_tokens("chat-admin=admin;main-only=agents:main")
#: A hang guard only: every expectation normally holds within a second.
PATIENCE_S = 60.0
BOT = """
def reply(turn):
    text = turn.state.state.inbox[-1].message.content
    return f"mybot heard {text!r} after {len(turn.history)} messages"
"""


class Terminal:
    """A child process on a pseudo-terminal: what it prints, and keys typed to it."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        master, slave = pty.openpty()
        self.master = master
        self.process = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=env, close_fds=True
        )
        os.close(slave)
        self.screen = ""
        self.seen = 0  # `expect` consumes the screen up to its match

    def _read(self, until: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], max(0.0, until - time.monotonic()))
        if not ready:
            return False
        try:
            chunk = os.read(self.master, 4096)
        except OSError:  # the child closed the terminal
            return False
        self.screen += chunk.decode("utf-8", "replace").replace("\r\n", "\n")
        return bool(chunk)

    def expect(self, text: str) -> str:
        """Waits until `text` is printed after the previous match; returns what came
        before it."""
        deadline = time.monotonic() + PATIENCE_S
        while (found := self.screen.find(text, self.seen)) < 0:
            if time.monotonic() > deadline or not self._read(deadline):
                if self.screen.find(text, self.seen) >= 0:
                    break
                raise AssertionError(f"never printed {text!r}; the screen:\n{self.screen}")
        found = self.screen.find(text, self.seen)
        before, self.seen = self.screen[self.seen : found], found + len(text)
        return before

    def type(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\n")

    def end(self) -> int:
        os.write(self.master, b"\x04")  # Ctrl-D: end of input
        deadline = time.monotonic() + PATIENCE_S
        while self.process.poll() is None and time.monotonic() < deadline:
            self._read(time.monotonic() + 0.2)
        return self.process.wait(timeout=PATIENCE_S)

    def rest(self) -> str:
        """Everything printed until the child exits (for a child that ends by itself)."""
        deadline = time.monotonic() + PATIENCE_S
        while self._read(deadline):
            pass
        self.process.wait(timeout=PATIENCE_S)
        return self.screen

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=PATIENCE_S)
        os.close(self.master)


#: The installed `switchboard` command, as users run it: unlike `python -m`, its
#: sys.path does not start with the current directory.
SWITCHBOARD = str(Path(sys.executable).parent / "switchboard")


def _chat_argv(session: str, delivery: str, *extra: str) -> list[str]:
    return [
        SWITCHBOARD, "chat", "--agent", "main",
        "--session-address", session, "--delivery-address", delivery, *extra,
    ]  # fmt: skip


def _environment(**extra: str) -> dict[str, str]:
    """The test's environment without PYTHONPATH (the callback must be found from the
    current directory by chat itself) and without a token unless given."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SWITCHBOARD_TOKEN")}
    return {**env, "TERM": "dumb", **extra}


@contextmanager
def _terminal(argv: list[str], cwd: Path, env: dict[str, str]) -> Iterator[Terminal]:
    terminal = Terminal(argv, cwd, env)
    try:
        yield terminal
    finally:
        terminal.close()


@pytest.fixture
def services(tmp_path: Path, loop_thread: EventLoopThread) -> Iterator[tuple[str, str]]:
    url = f"sqlite:///{tmp_path / 'chat.sqlite3'}"
    with (
        session_server(loop_thread, url, auth=GRANTS) as session,
        delivery_server(loop_thread, url, auth=GRANTS) as delivery,
    ):
        yield session.address, delivery.address


def test_a_person_chats_in_a_terminal(tmp_path: Path, services: tuple[str, str]) -> None:
    session, delivery = services
    workdir = tmp_path / "bot"
    workdir.mkdir()
    (workdir / "mybot.py").write_text(BOT)
    argv = _chat_argv(session, delivery, "--callback", "mybot:reply")
    with _terminal(argv, workdir, _environment(SWITCHBOARD_TOKEN="chat-admin")) as chat:
        chat.expect("agent 'main' does not exist; create it? [y/N]: ")
        chat.type("y")
        chat.expect("switchboard chat: agent 'main'")
        chat.expect('"/help" lists the commands')
        chat.expect("you> ")
        chat.type("/help")
        chat.expect("never sent to the agent")
        chat.expect("you> ")
        chat.type("hello there")
        chat.expect("agent> mybot heard 'hello there' after 0 messages")
        chat.expect("you> ")
        chat.type("/new")
        chat.expect("start a new one? [y/N] ")
        chat.type("n")
        chat.expect("kept the current session")
        chat.type("again")
        chat.expect("agent> mybot heard 'again' after 2 messages")
        chat.type("/new")
        chat.expect("[y/N] ")
        chat.type("y")
        chat.expect("started a new session")
        chat.type("fresh")
        chat.expect("agent> mybot heard 'fresh' after 0 messages")
        chat.expect("you> ")
        assert chat.end() == 0, chat.screen
    assert "Traceback" not in chat.screen
    with SessionClient(session, token="chat-admin") as client:
        listed = list(client.list_sessions("main", transport="repl"))
        assert len(listed) == 2, "the confirmed /new ended one session; the declined one did not"
        said = [
            m.message.content
            for s in listed
            for m in client.history("main", s.session_id, limit=100)
        ]
    assert "/help" not in said and "/new" not in said, "local commands never reach the agent"
    assert {"hello there", "again", "fresh"} <= set(said)


def test_a_token_from_the_command_line_and_a_refused_one(
    tmp_path: Path, services: tuple[str, str]
) -> None:
    session, delivery = services
    argv = _chat_argv(session, delivery, "--token", "main-only")
    with _terminal(argv, tmp_path, _environment()) as chat:
        chat.expect("create it? [y/N]: ")
        chat.type("y")
        screen = chat.rest()
        assert chat.process.returncode != 0
    assert "agent 'main' does not exist and this token may not create it" in screen
    with SessionClient(session, token="chat-admin") as client:
        client.create_agent("main")
    with _terminal(argv, tmp_path, _environment()) as chat:
        chat.expect("you> ")
        chat.type("hi")
        chat.expect("agent> (echo) hi")
        assert chat.end() == 0
    with _terminal(
        _chat_argv(session, delivery), tmp_path, _environment(SWITCHBOARD_TOKEN="wrong")
    ) as refused:
        screen = refused.rest()
        assert refused.process.returncode != 0
    assert "the services refused the token (UNAUTHENTICATED)" in screen
    assert "SWITCHBOARD_TOKEN" in screen
    assert "Traceback" not in screen


def test_services_down_is_one_line(tmp_path: Path) -> None:
    with _terminal(
        _chat_argv("127.0.0.1:1", "127.0.0.1:1"), tmp_path, _environment(SWITCHBOARD_TOKEN="x")
    ) as chat:
        screen = chat.rest()
        assert chat.process.returncode != 0
    assert "Traceback" not in screen
    errors = [line for line in screen.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "nothing answers at 127.0.0.1:1 (the SessionService)" in errors[0]
    assert "nothing answers at 127.0.0.1:1 (the DeliveryService)" in errors[0], screen
    assert re.search(r"switchboard serve", errors[0])


def test_services_killed_mid_chat(tmp_path: Path) -> None:
    """The services die (SIGKILL) during a conversation: each line typed then gets one
    error line, the prompt comes back, and /quit still leaves cleanly."""
    server = subprocess.Popen(
        [SWITCHBOARD, "serve", "--session-listen", "127.0.0.1:0", "--delivery-listen",
         "127.0.0.1:0", "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        addresses: list[str] = []
        while len(addresses) < 2 and (line := server.stdout.readline()):
            if match := re.search(r"listening on (\S+)", line):
                addresses.append(match.group(1))
        assert len(addresses) == 2, "the services did not start"
        with _terminal(_chat_argv(*addresses), tmp_path, _environment()) as chat:
            chat.expect("create it? [y/N]: ")
            chat.type("y")
            chat.expect("you> ")
            chat.type("hello")
            chat.expect("agent> (echo) hello")
            chat.expect("you> ")
            server.send_signal(signal.SIGKILL)
            server.wait(timeout=PATIENCE_S)
            chat.type("are you there")
            chat.expect("error: nothing answers at")
            chat.expect("you> ")
            chat.type("/quit")
            screen = chat.rest()
            assert chat.process.returncode == 0, screen
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=PATIENCE_S)
    assert "Traceback" not in chat.screen
    assert not [line for line in chat.screen.splitlines() if line.startswith("{")], (
        "a person's terminal gets text log lines, not JSON"
    )


@pytest.fixture
def services_on(database_url: str, loop_thread: EventLoopThread) -> Iterator[tuple[str, str]]:
    """The services on SQLite and on PostgreSQL."""
    with (
        session_server(loop_thread, database_url, auth=GRANTS) as session,
        delivery_server(loop_thread, database_url, auth=GRANTS) as delivery,
    ):
        yield session.address, delivery.address


def _agents(session: str) -> list[str]:
    with SessionClient(session, token="chat-admin") as client:
        return [agent.name for agent in client.list_agents()]


def test_chat_never_creates_an_agent_unasked(tmp_path: Path, services_on: tuple[str, str]) -> None:
    """Piped input needs --create; a terminal is asked, and no is no."""
    argv = _chat_argv(*services_on)
    env = _environment(SWITCHBOARD_TOKEN="chat-admin")
    piped = subprocess.run(
        argv, input="hello\n", env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=PATIENCE_S,
    )  # fmt: skip
    assert piped.returncode == 1, piped.stdout + piped.stderr
    assert "agent 'main' does not exist: pass --create to create it" in piped.stderr
    assert "switchboard agent create main" in piped.stderr and "Traceback" not in piped.stderr
    assert _agents(services_on[0]) == []

    with _terminal(argv, tmp_path, env) as declined:
        declined.expect("agent 'main' does not exist; create it? [y/N]: ")
        declined.type("n")
        screen = declined.rest()
        assert declined.process.returncode == 1, screen
    assert "nothing was created" in screen
    assert _agents(services_on[0]) == []

    created = subprocess.run(
        [*argv, "--create"], input="hello\n/quit\n", env=env, cwd=tmp_path,
        capture_output=True, text=True, timeout=PATIENCE_S,
    )  # fmt: skip
    assert created.returncode == 0, created.stdout + created.stderr
    assert "agent> (echo) hello" in created.stdout
    assert _agents(services_on[0]) == ["main"]
