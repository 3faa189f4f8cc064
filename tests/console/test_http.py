"""The console over plain HTTP against real services, on SQLite and Postgres: refusals
of forged and read-only writes (which write nothing), the login cookie and headers,
clear pages for bad input, one watch stream for many browsers, and the
`switchboard console` command."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import httpx
import pytest

from tests.console.deployment import TOKENS, Deployment, message

_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def _logged_in(base: str, who: str = "admin") -> httpx.Client:
    client = httpx.Client(base_url=base, follow_redirects=False, timeout=10)
    answer = client.post("/login", data={"token": TOKENS[who]}, headers={"origin": base})
    assert answer.status_code == 303, answer.text
    return client


def _csrf(client: httpx.Client) -> str:
    found = _CSRF.search(client.get("/sessions?agent=alice").text)
    assert found is not None
    return found.group(1)


@pytest.fixture
def admin(deployment: Deployment) -> Iterator[httpx.Client]:
    with closing(_logged_in(deployment.url)) as client:
        yield client


def test_forged_writes_are_refused_and_write_nothing(
    deployment: Deployment, admin: httpx.Client
) -> None:
    head = deployment.head()
    form = {"mode": "rewind", "sequence": "3", "confirm": "3"}
    origin = {"origin": deployment.url}
    attempts = [
        (form, origin),  # no CSRF token
        ({**form, "csrf": "not-the-token"}, origin),
        ({**form, "csrf": _csrf(admin)}, {"origin": "http://evil.example"}),
        ({**form, "csrf": _csrf(admin)}, {}),  # neither Origin nor Referer
    ]
    for data, headers in attempts:
        answer = admin.post("/rewind", data=data, headers=headers)
        assert answer.status_code == 403, (data, headers)
        assert "Refused" in answer.text
    assert deployment.head() == head


def test_a_read_only_console_refuses_every_write(deployment: Deployment) -> None:
    head = deployment.head()
    with closing(_logged_in(deployment.read_only_url)) as client:
        preview = client.get("/rewind?sequence=3")
        assert preview.status_code == 200
        assert 'action="/rewind"' not in preview.text.split('id="preview"')[1]  # no form
        csrf = _csrf(client)
        origin = {"origin": deployment.read_only_url}
        for path, data in (
            ("/rewind", {"mode": "rewind", "sequence": "3", "confirm": "3"}),
            ("/deliveries/confirm", {"action": "retry", "scope": "all"}),
            ("/deliveries/apply", {"action": "retry", "scope": "all"}),
        ):
            answer = client.post(path, data={**data, "csrf": csrf}, headers=origin)
            assert answer.status_code == 403, path
            assert "Read-only console" in answer.text
    assert deployment.head() == head


def test_the_login_cookie_and_headers(deployment: Deployment) -> None:
    with httpx.Client(base_url=deployment.url, follow_redirects=False) as client:
        refused = client.post("/login", data={"token": "wrong"}, headers={"origin": deployment.url})
        assert refused.status_code == 401 and "set-cookie" not in refused.headers
        answer = client.post(
            "/login", data={"token": TOKENS["admin"]}, headers={"origin": deployment.url}
        )
        cookie = answer.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie
        assert TOKENS["admin"] not in cookie and TOKENS["admin"] not in answer.headers["location"]
        for path in ("/", "/sessions", "/deliveries", "/audit", "/rewind?sequence=2"):
            page = client.get(path)
            assert page.status_code == 200, path
            policy = page.headers["content-security-policy"]
            assert "script-src 'self'" in policy and "unsafe-inline" not in policy
            assert TOKENS["admin"] not in page.text
            assert not re.search(r"<script(?![^>]*\bsrc=)", page.text), "an inline script"
            assert not re.search(r"\son[a-z]+=", page.text), "an inline event handler"
            assert " style=" not in page.text


def test_bad_input_gets_a_clear_page(deployment: Deployment, admin: httpx.Client) -> None:
    for path, status, says in (
        ("/rewind?sequence=abc", 400, "must be a sequence of the log"),
        ("/rewind?sequence=0", 400, "must be a sequence of the log"),
        (f"/rewind?sequence={2**64}", 400, "must be a sequence of the log"),
        ("/rewind?sequence=999999999", 400, "SEQUENCE_AHEAD_OF_LOG"),
        ("/rewind?checkpoint=nope", 404, "CHECKPOINT_NOT_FOUND"),
        ("/?before=-4", 400, "must be a sequence of the log"),
        ("/sessions/alice/no-such-session", 404, "SESSION_NOT_FOUND"),
        ("/sessions/Not%20An%20Agent/x", 400, "is not an agent name"),
        ("/sessions?state=sleeping", 400, "state must be open, ended"),
        ("/deliveries?state=lost", 400, "state must be owed"),
        ("/sessions?page=garbage", 400, "INVALID_PAGE_TOKEN"),
        ("/nowhere", 404, "Not found"),
    ):
        answer = admin.get(path)
        assert answer.status_code == status, (path, answer.text[-400:])
        assert says in answer.text, path
        assert "Traceback" not in answer.text
    with httpx.Client(base_url=deployment.url, follow_redirects=False) as stranger:
        assert stranger.get("/sessions").headers["location"] == "/login"


def test_many_browsers_share_one_watch_stream(deployment: Deployment) -> None:
    hub = deployment.console.hub
    assert hub is not None
    opened = hub.streams_opened
    head = deployment.head()
    browsers = 5
    received: list[set[int]] = [set() for _ in range(browsers)]
    ready = threading.Barrier(browsers + 1)
    appended: list[int] = []
    got = threading.Barrier(browsers + 1)
    leave = threading.Event()

    def follow(number: int) -> None:
        with (
            closing(_logged_in(deployment.url)) as client,
            client.stream("GET", f"/live?after={head}", timeout=20) as stream,
        ):
            ready.wait()
            for line in stream.iter_lines():
                if line.startswith("id: "):
                    received[number].add(int(line[4:]))
                if appended and appended[0] in received[number]:
                    got.wait()  # every browser holds its stream until all were counted
                    leave.wait(timeout=20)
                    return

    threads = [threading.Thread(target=follow, args=(n,)) for n in range(browsers)]
    for thread in threads:
        thread.start()
    ready.wait()
    _wait_until(lambda: hub.follower_count >= browsers)
    answer = deployment.append(deployment.seeded.bob_session, message("to all"), agent="bob")
    appended.append(answer.events[0].sequence)
    got.wait(timeout=20)
    assert all(appended[0] in seen for seen in received)
    assert hub.streams_opened - opened == 1  # one stream for every browser
    assert hub.follower_count == browsers
    leave.set()
    for thread in threads:
        thread.join(timeout=20)


def test_the_console_command_serves_the_login_page(deployment: Deployment) -> None:
    command = [
        str(Path(sys.executable).with_name("switchboard")),
        "console",
        "--session",
        _session_address(deployment),
        "--delivery",
        "127.0.0.1:9",
        "--listen",
        "127.0.0.1:0",
        "--read-only",
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        line = ""
        for line in process.stdout:
            if "console on http://" in line:
                break
        url = line.split("console on ", 1)[1].strip()
        answer = httpx.get(f"{url}/login", timeout=10)
        assert answer.status_code == 200 and "Log in" in answer.text
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_serve_all_serves_the_console_beside_the_services(
    deployment: Deployment, tmp_path: Path
) -> None:
    url = deployment.database_url
    command = [
        str(Path(sys.executable).with_name("switchboard")),
        "serve",
        "all",
        "--data-dir",
        str(tmp_path),
        "--session-listen",
        "127.0.0.1:0",
        "--delivery-listen",
        "127.0.0.1:0",
        "--session-database-url",
        url,
        "--delivery-database-url",
        url,
        "--console-listen",
        "127.0.0.1:0",
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        line = ""
        for line in process.stdout:
            if "console on http://" in line:
                break
        console = line.split("console on ", 1)[1].strip()
        with httpx.Client(base_url=console, follow_redirects=False, timeout=10) as client:
            answer = client.post("/login", data={"token": ""}, headers={"origin": console})
            assert answer.status_code == 303  # authentication is off: the services agree
            sessions = client.get("/sessions")
            assert sessions.status_code == 200
            assert deployment.seeded.alice_session in sessions.text  # the same database
    finally:
        process.terminate()
        assert process.wait(timeout=30) == 0


def _session_address(deployment: Deployment) -> str:
    return deployment.console.channels.session_target


def _wait_until(condition: object, timeout_s: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_an_agent_token_cannot_follow_the_live_tail(deployment: Deployment) -> None:
    with closing(_logged_in(deployment.url, "alice")) as client:
        assert client.get("/live").status_code == 403
