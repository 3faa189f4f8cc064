"""The code and the contracts stay clean: ruff, mypy, buf lint, fresh generated stubs."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(*command: str) -> None:
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout}{result.stderr}"


def test_ruff_lint() -> None:
    _run(str(BIN / "ruff"), "check", ".")


def test_ruff_format() -> None:
    _run(str(BIN / "ruff"), "format", "--check", ".")


def test_mypy_strict() -> None:
    _run(str(BIN / "mypy"))


def test_buf_lint() -> None:
    result = subprocess.run(
        [str(BIN / "buf"), "lint"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_protos_have_no_breaking_change_since_the_previous_commit() -> None:
    previous = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", "HEAD~1:protos"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if previous.returncode != 0:
        pytest.skip("no previous commit with protos/ to compare against")
    result = subprocess.run(
        [str(BIN / "buf"), "breaking", "protos", "--against", ".git#ref=HEAD~1,subdir=protos"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_kubernetes_manifests_validate_strictly() -> None:
    manifests = sorted(str(path) for path in (ROOT / "k8s").rglob("*.yaml"))
    assert manifests, "no manifests under k8s/"
    _run(str(BIN / "kubernetes-validate"), "--strict", "--quiet", *manifests)


@pytest.mark.parametrize("proto", sorted((ROOT / "protos").rglob("*.proto")), ids=lambda p: p.name)
def test_generated_stubs_match_the_protos(proto: Path, tmp_path: Path) -> None:
    """The installed stubs were generated from these protos (reinstall if this fails)."""
    relative = proto.relative_to(ROOT / "protos")
    _run(
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        "-I",
        str(ROOT / "protos"),
        f"--python_out={tmp_path}",
        f"--grpc_python_out={tmp_path}",
        f"--mypy_out={tmp_path}",
        f"--mypy_grpc_out={tmp_path}",
        f"--plugin=protoc-gen-mypy={BIN / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={BIN / 'protoc-gen-mypy_grpc'}",
        str(proto),
    )
    stem = relative.with_suffix("")
    for suffix in ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi", "_pb2_grpc.pyi"):
        generated = tmp_path / f"{stem}{suffix}"
        installed = ROOT / f"{stem}{suffix}"
        assert installed.exists(), f"{installed} is missing: run `python3 dev.py test` to reinstall"
        assert filecmp.cmp(generated, installed, shallow=False), (
            f"{installed} is stale: the proto changed since install; rerun `python3 dev.py test`"
        )
