"""The container image, built from k8s/Dockerfile and run with each manifest's
container spec (tests/deploy/pods.py): probes answer SERVING, SIGTERM drains within
the grace, the SQLite layout keeps its data across a restart on its volume, and
two replicas of each service share one Postgres, also when started together on an
empty database, and the docker compose deployment (deploy/compose.yaml: Postgres,
two replicas of each service, the loopback gateway) answers a message end to end.

A real Kubernetes cannot run on these machines; the manifests' Services,
NetworkPolicies, HPAs and PDBs are only validated (test_quality.py). In CI
(CI=true or SWITCHBOARD_REQUIRE_DOCKER=1) this module installs Debian's docker.io
and debootstrap when missing and never skips.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import grpc
import psycopg2
import pytest
from switchboard_client import DeliveryClient, SessionClient, SwitchboardError

from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from tests.deploy import docker_engine as engines
from tests.deploy.artefacts import ROOT, copy_tracked_tree, wait_serving
from tests.deploy.client_calls import delivery_calls, session_calls
from tests.deploy.compose import brought_up, compose_command, install_compose
from tests.deploy.manifests import Workload, workloads
from tests.deploy.pods import Container, start, stop_all
from tests.harness import POSTGRES_URL, postgres_unreachable_reason

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

VERSION = (ROOT / "VERSION").read_text().strip()
IMAGE = f"switchboard:{VERSION}"
TOKEN = "image-test-admin"
SECRETS = {"switchboard-auth": {"tokens": f"{TOKEN}=admin"}}
WORKLOADS = {workload.id: workload for workload in workloads()}


def _unavailable() -> str | None:
    """Why the image tests cannot run here, after installing what CI may install."""
    if os.geteuid() != 0:
        return "the image tests start their own dockerd, which needs root"
    missing = engines.missing_tools()
    if missing and engines.docker_required():
        engines.install_tools()
        missing = engines.missing_tools()
    if missing:
        return (
            f"{', '.join(missing)} not installed (CI installs Debian's docker.io and debootstrap)"
        )
    return None


@pytest.fixture(scope="module")
def engine() -> Iterator[engines.Engine]:
    reason = _unavailable()
    if reason and engines.docker_required():
        pytest.fail(f"{reason}; CI requires the image tests to run")
    if reason:
        pytest.skip(reason)
    with engines.docker_engine() as running:
        yield running


@dataclass
class Built:
    image: str
    base: dict[str, str]
    seconds: float


@pytest.fixture(scope="module")
def image(engine: engines.Engine, tmp_path_factory: pytest.TempPathFactory) -> Built:
    """k8s/Dockerfile built from the tracked files (untracked ones cannot sneak in)."""
    started = time.monotonic()
    tree = copy_tracked_tree(tmp_path_factory.mktemp("image") / "tree")
    dockerfile = tree / "k8s" / "Dockerfile"
    base = {
        name: engines.ensure_base_image(engine, name) for name in engines.base_images(dockerfile)
    }
    engine.run("build", "--file", dockerfile, "--tag", IMAGE, tree, timeout=900)
    # The store under CACHE is kept between runs: drop superseded images and old layers.
    engine.run("image", "prune", "--force", check=False)
    engine.run("builder", "prune", "--force", "--keep-storage", "3GB", check=False, timeout=300)
    size = int(engine.out("image", "inspect", "--format", "{{.Size}}", IMAGE))
    seconds = time.monotonic() - started
    print(f"\nimage {IMAGE}: {size / 1e6:.0f} MB, base {base}, ready in {seconds:.1f} s")
    return Built(IMAGE, base, seconds)


def test_the_image_runs_as_the_unprivileged_user_the_manifests_expect(
    engine: engines.Engine, image: Built
) -> None:
    assert engine.out("image", "inspect", "--format", "{{.Config.User}}", image.image) == "10001"
    for workload in WORKLOADS.values():
        security = workload.pod["securityContext"]
        assert security["runAsNonRoot"] and security["runAsUser"] == 10001
    shown = engine.out("run", "--rm", image.image, "--version")
    assert shown == f"switchboard, version {VERSION}"


def _volume(engine: engines.Engine) -> Iterator[str]:
    name = f"sb-data-{uuid.uuid4().hex[:8]}"
    engine.run("volume", "create", name)
    try:
        yield name
    finally:
        engine.run("volume", "rm", "--force", name, check=False)


@pytest.fixture
def volume(engine: engines.Engine) -> Iterator[str]:
    yield from _volume(engine)


def _announced_url(container: Container) -> str:
    for line in container.logs().splitlines():
        if "listening on" in line:
            return line.rsplit("(", 1)[1].rstrip(")")
    raise AssertionError(f"{container.name} announced no listener:\n{container.logs()}")


def _stop_in_grace(containers: list[Container]) -> None:
    for name, (code, seconds) in stop_all(containers).items():
        grace = next(c for c in containers if c.name == name).workload.grace_s
        assert code == 0, f"{name} exited {code} after SIGTERM"
        assert seconds < grace, f"{name} took {seconds:.1f} s, past its {grace:.0f} s grace"


def _watch_until_the_server_stops(address: str) -> threading.Event:
    """An open WatchEvents stream on a thread; the event is set when the stream ends."""
    ended = threading.Event()
    first_event = threading.Event()

    def watch() -> None:
        try:
            with SessionClient(address, token=TOKEN) as sessions:
                for _event in sessions.watch():
                    first_event.set()
        except SwitchboardError:
            pass
        finally:
            ended.set()

    threading.Thread(target=watch, daemon=True).start()
    assert first_event.wait(timeout=10), "the watch did not start"
    return ended


@pytest.mark.parametrize("which", ["session", "delivery"])
def test_sqlite_layout_runs_as_specified_and_keeps_its_data_across_a_restart(
    engine: engines.Engine, image: Built, volume: str, which: str
) -> None:
    workload = WORKLOADS[f"sqlite/{which}"]
    environment = workload.env(SECRETS)
    claims = {name: volume for name in workload.claim_templates}
    first = start(engine, workload, image.image, environment, claims)
    try:
        first.wait_probes()
        grpc_address = first.address(workload.ports["grpc"])
        assert _announced_url(first) == environment[f"SWITCHBOARD_{which.upper()}_DATABASE_URL"]
        calls = session_calls if which == "session" else delivery_calls
        done = calls(grpc_address, "sqlite", TOKEN)
        # The auth Secret reached the server: a call without its token is refused.
        with pytest.raises(SwitchboardError) as refused:
            calls(grpc_address, "anonymous")
        assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
        metrics = f"http://{first.address(workload.ports['metrics'])}/metrics"
        with urllib.request.urlopen(metrics, timeout=10) as response:
            assert response.status == 200 and b"grpc" in response.read()
        # A watch stays open across the stop: the drain must still end within the grace.
        watching = _watch_until_the_server_stops(grpc_address) if which == "session" else None
        _stop_in_grace([first])
        assert watching is None or watching.wait(timeout=10), "the watch outlived the server"
    finally:
        first.remove()
    second = start(engine, workload, image.image, environment, claims)
    try:
        second.wait_probes()
        address = second.address(workload.ports["grpc"])
        if which == "session":
            with SessionClient(address, token=TOKEN) as sessions:
                history = sessions.history("agent-sqlite", str(done["session_id"]))
            assert [message.message.content for message in history] == ["hello sqlite"]
        else:
            with DeliveryClient(address, token=TOKEN) as ledger:
                assert ledger.get(str(done["recorded"])).id == done["recorded"]
        _stop_in_grace([second])
    finally:
        second.remove()


@contextmanager
def fresh_database() -> Iterator[str]:
    """A fresh, empty Postgres database; dropped afterwards."""
    reason = postgres_unreachable_reason()
    if reason and engines.docker_required():
        pytest.fail(reason)
    if reason:
        pytest.skip(reason)
    name = f"sb_image_{uuid.uuid4().hex[:10]}"
    admin = psycopg2.connect(POSTGRES_URL)
    admin.autocommit = True
    with admin.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {name}")
    try:
        yield POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
            )
            cursor.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.close()


@pytest.fixture
def database() -> Iterator[str]:
    with fresh_database() as url:
        yield url


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def _replica(
    engine: engines.Engine,
    workload: Workload,
    image: str,
    url: str,
    label: str,
    host_ports: list[int] | None = None,
) -> Container:
    """One replica of a Postgres workload on the host's network (to reach 127.0.0.1:5432)."""
    environment = workload.env({**SECRETS, "switchboard-postgres": {"url": url}})
    chosen = host_ports or _free_ports(len(workload.ports))
    ports = dict(zip(workload.ports.values(), chosen, strict=True))
    return start(engine, workload, image, environment, host_ports=ports, label=label)


def _replicas_at_once(engine: engines.Engine, image: str, url: str) -> dict[str, Container]:
    """Two replicas of each Postgres workload, all `docker run` at the same moment."""
    keys = [f"{which}-{n}" for n in (1, 2) for which in ("session", "delivery")]
    workloads_ = {key: WORKLOADS[f"postgres/{key.split('-')[0]}"] for key in keys}
    # All ports at once, before the threads start: chosen one replica at a time, a
    # port freed for one replica could be handed out again for another.
    free = iter(_free_ports(sum(len(w.ports) for w in workloads_.values())))
    ports = {key: [next(free) for _ in workload.ports] for key, workload in workloads_.items()}
    with ThreadPoolExecutor(len(keys)) as pool:
        futures = {
            key: pool.submit(
                _replica, engine, workloads_[key], image, url,
                f"{key}-{uuid.uuid4().hex[:6]}", ports[key],
            )
            for key in keys
        }  # fmt: skip
    return {key: future.result() for key, future in futures.items()}


def _calls_across_replicas(replicas: dict[str, Container]) -> None:
    def grpc_address(key: str) -> str:
        container = replicas[key]
        return container.address(container.workload.ports["grpc"])

    created = session_calls(grpc_address("session-1"), "replicas", TOKEN)
    with SessionClient(grpc_address("session-2"), token=TOKEN) as sessions:
        history = sessions.history("agent-replicas", str(created["session_id"]))
    assert [message.message.content for message in history] == ["hello replicas"]
    with DeliveryClient(grpc_address("delivery-1"), token=TOKEN) as first:
        owner = first.register("replica-test", ["web"]).instance_id
        recorded = first.record(
            owner, session_key="key", content="reply", platform="web", chat_id="chat"
        ).obligation
        first.deregister(owner)
    with DeliveryClient(grpc_address("delivery-2"), token=TOKEN) as second:
        taker = second.register("replica-test", ["web"]).instance_id
        claimed = second.claim_recoverable(taker, deliverable_platforms=["web"]).obligations
    assert [row.id for row in claimed] == [recorded.id]


def test_postgres_layout_runs_two_replicas_of_each_on_one_database(
    engine: engines.Engine, image: Built, database: str
) -> None:
    workloads_ = [WORKLOADS["postgres/session"], WORKLOADS["postgres/delivery"]]
    replicas: dict[str, Container] = {}
    try:
        # One of each first (it creates the schema), then the second replicas.
        for n in (1, 2):
            for workload in workloads_:
                which = workload.container["name"]
                replicas[f"{which}-{n}"] = _replica(
                    engine, workload, image.image, database, f"{which}-{n}-{uuid.uuid4().hex[:6]}"
                )
            for key, container in replicas.items():
                if key.endswith(str(n)):
                    container.wait_probes()
        for container in replicas.values():
            assert _announced_url(container) == database
        _calls_across_replicas(replicas)
        _stop_in_grace(list(replicas.values()))
    finally:
        for container in replicas.values():
            container.remove()


# The race does not strike every time: three rounds, each on a new empty database.
TOGETHER_ROUNDS = 3


def test_replicas_started_together_on_an_empty_database(
    engine: engines.Engine, image: Built
) -> None:
    for _round in range(TOGETHER_ROUNDS):
        with fresh_database() as database:
            replicas = _replicas_at_once(engine, image.image, database)
            try:
                for container in replicas.values():
                    container.wait_probes()
                _calls_across_replicas(replicas)
                _stop_in_grace(list(replicas.values()))
            finally:
                for container in replicas.values():
                    container.remove()


def test_the_build_context_of_a_checkout_holds_only_sources(
    engine: engines.Engine, image: Built
) -> None:
    """What `docker build .` sends from this very checkout (with its .venv,
    node_modules and .git): .dockerignore must keep those out."""
    listing = "FROM python:3.11-slim\nCOPY . /context\nRUN du -sk /context && ls -a /context\n"
    result = engine.run(
        "build", "--no-cache", "--progress=plain", "--file", "-", ROOT, input=listing, timeout=300
    )
    output = result.stdout + result.stderr
    sizes = re.findall(r"(\d+)\s+/context$", output, re.MULTILINE)
    assert sizes, output
    kilobytes = int(sizes[0])
    print(f"\nbuild context of {ROOT}: {kilobytes / 1024:.1f} MB")
    for kept_out in (".venv", ".git", "node_modules"):
        assert f" {kept_out}\n" not in output, f"{kept_out} is in the build context"
    assert kilobytes < 20 * 1024, f"the build context is {kilobytes / 1024:.0f} MB"


@pytest.fixture
def compose(engine: engines.Engine) -> list[str]:
    """The compose command (tests/deploy/compose.py); CI installs Debian's when missing."""
    command = compose_command(engine)
    if command is None and engines.docker_required():
        install_compose()
        command = compose_command(engine)
    if command is None:
        pytest.skip("no docker compose or docker-compose (CI installs Debian's docker-compose)")
    return command


COMPOSE_TOKENS = "compose-admin-token-7c1e=admin"
COMPOSE_REPLICAS = {
    "session-1": ("SESSION_1_PORT", "switchboard.session.v1.SessionService"),
    "session-2": ("SESSION_2_PORT", "switchboard.session.v1.SessionService"),
    "delivery-1": ("DELIVERY_1_PORT", "switchboard.delivery.v1.DeliveryService"),
    "delivery-2": ("DELIVERY_2_PORT", "switchboard.delivery.v1.DeliveryService"),
}
#: The health checks' start periods and intervals, with room for a busy machine.
COMPOSE_HEALTHY_S = 240.0


def _post_message(address: str, **fields: str) -> dict[str, str]:
    request = urllib.request.Request(
        f"http://{address}/messages", data=json.dumps(fields).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return dict(json.loads(answer.read()))


def test_the_compose_deployment_answers_through_its_gateway_on_every_replica(
    engine: engines.Engine, image: Built, compose: list[str]
) -> None:
    """deploy/compose.yaml for real: Postgres, two replicas of each service on it and
    the loopback gateway, with authentication on and a password of the test's."""
    started = time.monotonic()
    base = engines.ensure_base_image(engine, "postgres:15")
    ports = dict(zip([*(v for v, _ in COMPOSE_REPLICAS.values()), "GATEWAY_PORT"],
                     map(str, _free_ports(5)), strict=True))  # fmt: skip
    settings = {
        **ports,
        "POSTGRES_PASSWORD": "compose-test-7f3a9c1e",
        "SWITCHBOARD_AUTH_TOKENS": COMPOSE_TOKENS,
        # The gateway creates its agent at the first start: an admin token.
        "SWITCHBOARD_GATEWAY_TOKEN": "compose-admin-token-7c1e",
    }
    with brought_up(engine, compose, settings) as project:
        project.wait_healthy(["postgres", *COMPOSE_REPLICAS, "gateway"], COMPOSE_HEALTHY_S)
        addresses = {name: f"127.0.0.1:{ports[v]}" for name, (v, _) in COMPOSE_REPLICAS.items()}
        for name, (_, service) in COMPOSE_REPLICAS.items():
            assert wait_serving(addresses[name], service) == "SERVING", name

        answer = _post_message(f"127.0.0.1:{ports['GATEWAY_PORT']}", chat_id="42", text="hi")

        assert answer == {"reply": "(echo) hi [0 earlier messages in this conversation]"}
        for name in ("session-1", "session-2"):
            with SessionClient(addresses[name], token="compose-admin-token-7c1e") as sessions:
                (only,) = sessions.list_sessions("main")
                said = [m.message.content for m in sessions.history("main", only.session_id)]
            assert said == ["hi", answer["reply"]], name
        for name in ("delivery-1", "delivery-2"):
            with DeliveryClient(addresses[name], token="compose-admin-token-7c1e") as ledger:
                rows = [(row.content, row.state) for row in ledger.list(platform="loopback")]
            assert rows == [(answer["reply"], dpb.OBLIGATION_STATE_DELIVERED)], name
        with pytest.raises(SwitchboardError) as refused:  # the tokens reached the services
            session_calls(addresses["session-2"], "anonymous")
        assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
        project.run("down", "--volumes", "--timeout", "30")
        assert project.containers_left() == []
    seconds = time.monotonic() - started
    print(f"\ncompose ({compose[-1]}; postgres:15 {base}): up, checked and down in {seconds:.0f} s")
