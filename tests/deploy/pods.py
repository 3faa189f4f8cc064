"""A manifest's container spec run with `docker run`, field by field, the way the
kubelet would run it: command and args, env, ports, user and groups, read-only root,
dropped capabilities, no privilege escalation, memory limit, volumes (emptyDir as a
tmpfs, a claim as a named volume), probes on the published ports, preStop before
SIGTERM and the termination grace."""

from __future__ import annotations

import re
import threading
import time
import uuid
from dataclasses import dataclass, field

from tests.deploy.artefacts import wait_serving
from tests.deploy.docker_engine import Engine
from tests.deploy.manifests import Workload


def _memory(quantity: str) -> str:
    """A Kubernetes quantity (256Mi, 1Gi) as docker's --memory value."""
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi)?", quantity)
    assert match, f"unsupported memory quantity {quantity}"
    return match.group(1) + {"Ki": "k", "Mi": "m", "Gi": "g", None: "b"}[match.group(2)]


def run_arguments(
    workload: Workload,
    image: str,
    environment: dict[str, str],
    claims: dict[str, str],
    host_ports: dict[int, int] | None,
) -> list[str]:
    """`docker run` options and command for the workload. `claims` maps each
    persistent volume to a docker volume. With `host_ports` (containerPort -> host
    port) the container shares the host's network and its listen arguments move to
    127.0.0.1 and those ports (a pod has its own ports, the host has one set);
    without, each containerPort is published on a random 127.0.0.1 port."""
    pod = workload.pod.get("securityContext", {})
    own = workload.container.get("securityContext", {})
    options: list[str] = []
    user, group = (
        own.get("runAsUser", pod.get("runAsUser")),
        own.get("runAsGroup", pod.get("runAsGroup")),
    )
    if user is not None:
        options += ["--user", f"{user}:{group}" if group is not None else str(user)]
    if pod.get("fsGroup") is not None:
        options += ["--group-add", str(pod["fsGroup"])]
    if own.get("readOnlyRootFilesystem"):
        options.append("--read-only")
    if own.get("allowPrivilegeEscalation") is False:
        options += ["--security-opt", "no-new-privileges"]
    for capability in own.get("capabilities", {}).get("drop", []):
        options += ["--cap-drop", capability]
    for capability in own.get("capabilities", {}).get("add", []):
        options += ["--cap-add", capability]
    limit = workload.container.get("resources", {}).get("limits", {}).get("memory")
    if limit:
        options += ["--memory", _memory(limit)]
    for name, path in workload.mounts().items():
        volume = workload.volume(name)
        if "emptyDir" in volume:
            options += ["--tmpfs", f"{path}:rw,nosuid,nodev,mode=1777"]
        else:
            options += ["--volume", f"{claims[name]}:{path}"]
    for name, value in environment.items():
        options += ["--env", f"{name}={value}"]
    args = list(workload.args)
    if host_ports is None:
        for port in workload.ports.values():
            options += ["--publish", f"127.0.0.1::{port}"]
    else:
        options += ["--network", "host"]
        for index, port in workload.listen_args().items():
            args[index] = f"127.0.0.1:{host_ports[port]}"
    command = workload.command
    if command:
        options += ["--entrypoint", command[0]]
    return [*options, image, *command[1:], *args]


@dataclass
class Container:
    engine: Engine
    name: str
    workload: Workload
    host_ports: dict[int, int] = field(default_factory=dict)

    def logs(self) -> str:
        result = self.engine.run("logs", self.name, check=False)
        return result.stdout + result.stderr

    def state(self) -> str:
        return self.engine.out("inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", self.name)

    def address(self, container_port: int) -> str:
        return f"127.0.0.1:{self.host_ports[container_port]}"

    def wait_probes(self) -> None:
        """Each probe's service SERVING, the startup probe within its failure budget;
        a container that exits meanwhile fails at once, with its logs."""
        startup = self.workload.container.get("startupProbe", {})
        budget = float(startup.get("periodSeconds", 10)) * float(startup.get("failureThreshold", 3))
        deadline = time.monotonic() + budget
        for probe in self.workload.probes:
            status = ""
            while status != "SERVING" and time.monotonic() < deadline:
                state = self.state()
                assert state.startswith("running"), f"{self.name} is {state}:\n{self.logs()}"
                status = wait_serving(self.address(probe.port), probe.service, timeout_s=1.0)
            seen = f"{probe.kind} {probe.service!r}: {status} ({self.state()})"
            assert status == "SERVING", f"{self.name} {seen}\n{self.logs()}"

    def stop_like_the_kubelet(self) -> tuple[int, float]:
        """preStop, then SIGTERM, all within terminationGracePeriodSeconds (else
        SIGKILL, as the kubelet does). Returns the exit code and seconds taken."""
        grace = self.workload.grace_s
        started = time.monotonic()
        if self.workload.pre_stop:
            self.engine.run("exec", self.name, *self.workload.pre_stop, timeout=grace)
        self.engine.run("kill", "--signal", "TERM", self.name)
        left = max(grace - (time.monotonic() - started), 0.1)
        try:
            code = int(self.engine.out("wait", self.name, timeout=left))
        except Exception:
            self.engine.run("kill", self.name, check=False)
            code = int(self.engine.out("wait", self.name))
        return code, time.monotonic() - started

    def remove(self) -> None:
        self.engine.run("rm", "--force", self.name, check=False)


def start(
    engine: Engine,
    workload: Workload,
    image: str,
    environment: dict[str, str],
    claims: dict[str, str] | None = None,
    host_ports: dict[int, int] | None = None,
    label: str = "",
) -> Container:
    name = f"sb-{workload.container['name']}-{label or uuid.uuid4().hex[:8]}"
    arguments = run_arguments(workload, image, environment, claims or {}, host_ports)
    engine.run("run", "--detach", "--name", name, *arguments)
    container = Container(engine, name, workload, dict(host_ports or {}))
    if host_ports is None:
        for port in workload.ports.values():
            published = engine.out("port", name, f"{port}/tcp").splitlines()[0]
            container.host_ports[port] = int(published.rsplit(":", 1)[1])
    return container


def stop_all(containers: list[Container]) -> dict[str, tuple[int, float]]:
    """Stops the containers at once, as a rollout or a node drain would."""
    results: dict[str, tuple[int, float]] = {}

    def stop(container: Container) -> None:
        results[container.name] = container.stop_like_the_kubelet()

    threads = [threading.Thread(target=stop, args=(container,)) for container in containers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results
