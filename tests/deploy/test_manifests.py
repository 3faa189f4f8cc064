"""The manifests match what the program does: every argument is one the CLI accepts,
every environment variable one it reads, every probe names a service the server
registers, the ports agree with each other, and each workload's command line, run
as a process with its environment, answers its probes. (test_image.py runs the
same specs in the real image; `kubernetes-validate --strict` is in test_quality.py.)"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import click
import grpc
import pytest

from delivery_service.app import DeliveryUnit
from session_service.app import SessionUnit
from switchboard_cli.main import main
from tests.deploy.artefacts import health_status, wait_serving
from tests.deploy.manifests import Workload, secrets, services, workloads
from tests.harness import postgres_schema, postgres_unreachable_reason

ROOT = Path(__file__).resolve().parents[2]
VERSION = (ROOT / "VERSION").read_text().strip()
WORKLOADS = workloads()
SERVED = {"session": {SessionUnit.service_name}, "delivery": {DeliveryUnit.service_name}}
SERVED["all"] = SERVED["session"] | SERVED["delivery"]
_ANNOUNCED = re.compile(r"Service listening on (?P<address>\S+) \((?P<url>[^)]*)\)")


def by_id(workload: Workload) -> str:
    return workload.id


def _serve_context(workload: Workload) -> click.Context:
    """The `serve` context the workload's arguments produce: parsed and validated (types,
    callbacks) exactly as at start-up, without running anything."""
    assert not workload.command, "a command would replace the image's `switchboard` entrypoint"
    name, *rest = workload.args
    parent = click.Context(main, info_name="switchboard")
    command = main.get_command(parent, name)
    assert command is not None, f"{workload.id}: `switchboard {name}` is no command"
    return command.make_context(name, rest, parent=parent)


def test_there_are_workloads_to_check() -> None:
    assert {workload.id for workload in WORKLOADS} == {
        "sqlite/session", "sqlite/delivery", "postgres/session", "postgres/delivery",
    }  # fmt: skip


@pytest.mark.parametrize("workload", WORKLOADS, ids=by_id)
def test_every_argument_is_accepted_by_the_cli(workload: Workload) -> None:
    context = _serve_context(workload)
    assert context.params["which"] == workload.container["name"]


@pytest.mark.parametrize("workload", WORKLOADS, ids=by_id)
def test_every_environment_variable_is_read_by_the_cli(workload: Workload) -> None:
    command = _serve_context(workload).command
    read = {
        name
        for parameter in [*main.params, *command.params]
        for name in (
            [parameter.envvar] if isinstance(parameter.envvar, str) else parameter.envvar or []
        )
    }
    assert sorted(set(workload.env_names) - read) == [], "set in the manifest, read by nobody"


@pytest.mark.parametrize("workload", WORKLOADS, ids=by_id)
def test_probes_name_services_the_server_registers(workload: Workload) -> None:
    served = SERVED[_serve_context(workload).params["which"]]
    assert {probe.kind for probe in workload.probes} == {
        "startupProbe",
        "readinessProbe",
        "livenessProbe",
    }
    for probe in workload.probes:
        assert probe.service in served | {""}, f"{probe.kind} asks for {probe.service!r}"


@pytest.mark.parametrize("workload", WORKLOADS, ids=by_id)
def test_ports_agree(workload: Workload) -> None:
    ports = workload.ports
    assert {probe.port for probe in workload.probes} <= {ports["grpc"]}
    assert sorted(workload.listen_args().values()) == sorted(ports.values()), (
        "every listen argument has its containerPort and every containerPort a listener"
    )
    assert workload.annotations["prometheus.io/port"] == str(ports["metrics"])
    (service,) = (
        document
        for _path, document in services()
        if _path == workload.path and document["metadata"]["name"] == workload.name
    )
    assert service["spec"]["selector"].items() <= workload.labels.items()
    for port in service["spec"]["ports"]:
        assert port["targetPort"] in ports or port["targetPort"] in ports.values()


@pytest.mark.parametrize("workload", WORKLOADS, ids=by_id)
def test_images_carry_the_version(workload: Workload) -> None:
    assert workload.image == f"switchboard:{VERSION}"


@pytest.mark.parametrize("workload", WORKLOADS, ids=by_id)
def test_secret_references_name_secrets_the_manifests_define(workload: Workload) -> None:
    defined = secrets()
    for entry in workload.container.get("env", []):
        reference = entry.get("valueFrom", {}).get("secretKeyRef")
        if reference:
            assert reference["key"] in defined.get(reference["name"], {}), reference


def local_args(workload: Workload) -> list[str]:
    """The arguments with each listen address moved to 127.0.0.1 and a free port:
    a process shares this host's ports, where a pod has its own."""
    args = list(workload.args)
    for index in workload.listen_args():
        args[index] = "127.0.0.1:0"
    return args


@contextmanager
def database_for(workload: Workload, tmp_path: Path) -> Iterator[str]:
    """A fresh Postgres schema for the Postgres layout (skipped off CI when none answers)."""
    reason = postgres_unreachable_reason()
    required = os.environ.get("CI", "").lower() in ("1", "true") or os.environ.get(
        "SWITCHBOARD_REQUIRE_POSTGRES"
    ) in ("1", "true")
    if reason and required:
        pytest.fail(reason)
    if reason:
        pytest.skip(reason)
    with postgres_schema() as url:
        yield url


@contextmanager
def started(
    workload: Workload, environment: dict[str, str], cwd: Path
) -> Iterator[tuple[str, str]]:
    """The workload's command line as a process: yields the address and database URL it
    announced; afterwards it must stop on SIGTERM with exit code 0 within the grace."""
    process = subprocess.Popen(
        [sys.executable, "-m", "switchboard_cli", *local_args(workload)],
        cwd=cwd,
        env={**os.environ, **environment},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        announced = None
        for line in process.stdout:
            announced = _ANNOUNCED.search(line) or announced
            if "ready;" in line:
                break
        assert announced, f"{workload.id} did not start (exit code {process.poll()})"
        yield announced.group("address"), announced.group("url")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=workload.grace_s) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.parametrize("workload", WORKLOADS, ids=by_id)
def test_each_workload_runs_as_a_process_and_answers_its_probes(
    workload: Workload, tmp_path: Path
) -> None:
    with ExitStack() as stack:
        url = ""
        if workload.path.parent.name == "postgres":
            url = stack.enter_context(database_for(workload, tmp_path))
        values = {
            "switchboard-auth": {"tokens": "probe-test-admin=admin"},
            "switchboard-pii": {"key": "probe-test-pii-key-of-32-bytes.."},
            "switchboard-postgres": {"url": url},
        }
        # The SQLite layout's /data volume is tmp_path here.
        environment = {
            name: value.replace("sqlite:////data/", f"sqlite:///{tmp_path}/")
            for name, value in workload.env(values).items()
        }
        (expected_url,) = (
            value for name, value in environment.items() if name.endswith("_DATABASE_URL")
        )
        address, announced_url = stack.enter_context(started(workload, environment, tmp_path))
        assert announced_url == expected_url, "the database URL from the environment was not used"
        for probe in workload.probes:
            assert wait_serving(address, probe.service) == "SERVING", probe
        with pytest.raises(grpc.RpcError) as unknown:
            health_status(address, "switchboard.no.such.Service")
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
