"""The Kubernetes manifests under k8s/, read as what each container must do: its
command line, environment (Secret values supplied by the caller), ports, user,
security context, volumes, probes and termination grace."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
WORKLOAD_KINDS = ("Deployment", "StatefulSet")
_LISTEN_ARG = re.compile(r"^(?P<host>[\d.]+|\[[\d:a-f]*\]|[\w.-]+):(?P<port>\d+)$")


def documents() -> list[tuple[Path, dict[str, Any]]]:
    return [
        (path, document)
        for path in sorted(K8S.rglob("*.yaml"))
        for document in yaml.safe_load_all(path.read_text())
        if document
    ]


def secrets() -> dict[str, dict[str, str]]:
    """Every Secret the manifests define, name -> its stringData (placeholders)."""
    return {
        document["metadata"]["name"]: dict(document.get("stringData", {}))
        for _path, document in documents()
        if document["kind"] == "Secret"
    }


@dataclass(frozen=True)
class Probe:
    kind: str  # startupProbe, readinessProbe, livenessProbe
    port: int
    service: str


@dataclass(frozen=True)
class Workload:
    """One Deployment's or StatefulSet's pod template, with its single container."""

    path: Path
    kind: str
    name: str
    replicas: int
    pod: dict[str, Any]
    container: dict[str, Any]
    claim_templates: tuple[str, ...]
    annotations: dict[str, str]
    labels: dict[str, str]

    @property
    def id(self) -> str:
        return f"{self.path.parent.name}/{self.path.stem}"

    @property
    def image(self) -> str:
        return str(self.container["image"])

    @property
    def command(self) -> list[str]:
        return [str(part) for part in self.container.get("command", [])]

    @property
    def args(self) -> list[str]:
        return [str(part) for part in self.container.get("args", [])]

    @property
    def grace_s(self) -> float:
        return float(self.pod.get("terminationGracePeriodSeconds", 30))

    @property
    def ports(self) -> dict[str, int]:
        return {port["name"]: int(port["containerPort"]) for port in self.container["ports"]}

    @property
    def probes(self) -> list[Probe]:
        return [
            Probe(
                kind,
                int(self.container[kind]["grpc"]["port"]),
                self.container[kind]["grpc"].get("service", ""),
            )
            for kind in ("startupProbe", "readinessProbe", "livenessProbe")
            if "grpc" in self.container.get(kind, {})
        ]

    @property
    def pre_stop(self) -> list[str]:
        hook = self.container.get("lifecycle", {}).get("preStop", {})
        return [str(part) for part in hook.get("exec", {}).get("command", [])]

    @property
    def env_names(self) -> list[str]:
        return [entry["name"] for entry in self.container.get("env", [])]

    def env(self, secret_values: dict[str, dict[str, str]]) -> dict[str, str]:
        """The container's environment with `secret_values` for secretKeyRefs; a
        reference to a missing optional key is left out, as the kubelet does."""
        environment: dict[str, str] = {}
        for entry in self.container.get("env", []):
            if "value" in entry:
                environment[entry["name"]] = str(entry["value"])
                continue
            reference = entry["valueFrom"]["secretKeyRef"]
            value = secret_values.get(reference["name"], {}).get(reference["key"])
            if value is None and not reference.get("optional", False):
                raise KeyError(
                    f"{self.id}: no value for Secret {reference['name']}/{reference['key']}"
                )
            if value is not None:
                environment[entry["name"]] = value
        return environment

    def listen_args(self) -> dict[int, int]:
        """Argument index -> port, for every host:port argument (the listen addresses)."""
        return {
            index: int(match.group("port"))
            for index, arg in enumerate(self.args)
            if (match := _LISTEN_ARG.match(arg))
        }

    def mounts(self) -> dict[str, str]:
        """Volume name -> mount path."""
        return {
            mount["name"]: mount["mountPath"] for mount in self.container.get("volumeMounts", [])
        }

    def volume(self, name: str) -> dict[str, Any]:
        for volume in self.pod.get("volumes", []):
            if volume["name"] == name:
                return dict(volume)
        if name in self.claim_templates:
            return {"name": name, "persistentVolumeClaim": {}}
        raise KeyError(f"{self.id}: volume {name} is not defined")


def workloads() -> list[Workload]:
    found = []
    for path, document in documents():
        if document["kind"] not in WORKLOAD_KINDS:
            continue
        template = document["spec"]["template"]
        (container,) = template["spec"]["containers"]
        found.append(
            Workload(
                path=path,
                kind=document["kind"],
                name=document["metadata"]["name"],
                replicas=int(document["spec"].get("replicas", 1)),
                pod=template["spec"],
                container=container,
                claim_templates=tuple(
                    claim["metadata"]["name"]
                    for claim in document["spec"].get("volumeClaimTemplates", [])
                ),
                annotations=dict(template["metadata"].get("annotations", {})),
                labels=dict(template["metadata"].get("labels", {})),
            )
        )
    return found


def services() -> list[tuple[Path, dict[str, Any]]]:
    return [(path, document) for path, document in documents() if document["kind"] == "Service"]
