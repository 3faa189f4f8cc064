"""deploy/compose.yaml read as a file (tests/deploy/test_image.py brings it up): the
image it runs carries the version, the database is the image the tests can stand in
for, and nothing is published beyond the host's loopback."""

from __future__ import annotations

from typing import Any

import yaml

from tests.deploy.artefacts import ROOT
from tests.deploy.compose import COMPOSE_FILE
from tests.deploy.docker_engine import STANDINS

VERSION = (ROOT / "VERSION").read_text().strip()
SERVICES: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())["services"]


def test_every_switchboard_service_runs_the_versioned_image_and_postgres_a_known_one() -> None:
    images = {name: service["image"] for name, service in SERVICES.items()}
    assert images.pop("postgres") in STANDINS
    assert set(images.values()) == {f"switchboard:{VERSION}"}


def test_two_replicas_of_each_service_answer_to_its_name() -> None:
    for which in ("session", "delivery"):
        replicas = [name for name in SERVICES if name.startswith(f"{which}-")]
        assert len(replicas) == 2, which
        for name in replicas:
            assert SERVICES[name]["networks"]["default"]["aliases"] == [which], name


def test_ports_are_published_on_the_hosts_loopback_only() -> None:
    published = [port for service in SERVICES.values() for port in service.get("ports", [])]
    assert len(published) == 5  # four replicas and the gateway
    for port in published:
        assert port.startswith("127.0.0.1:"), port
