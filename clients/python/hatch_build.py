"""Put the stubs hatch-protobuf generates from ../../protos into the client wheel.

They are generated into the repository's `switchboard/` tree (outside this
project), so hatchling would not pick them up by itself. Editable installs skip
this: there the server's editable install makes that tree importable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.config import BuilderConfig
from hatchling.builders.hooks.plugin.interface import BuildHookInterface

STUB_SUFFIXES = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi", "_pb2_grpc.pyi")


class StubsInWheel(BuildHookInterface[BuilderConfig]):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if version != "standard":
            return
        tree = Path(self.root).resolve().parents[1]
        protos = tree / "protos"
        for proto in sorted(protos.rglob("*.proto")):
            stem = proto.relative_to(protos).with_suffix("").as_posix()
            for suffix in STUB_SUFFIXES:
                build_data["force_include"][str(tree / f"{stem}{suffix}")] = f"{stem}{suffix}"
