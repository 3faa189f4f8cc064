"""dev.py's install decisions: `serve` needs the runtime, `test` the dev extra on top;
a reinstall follows the inputs (pyproject.toml, VERSION, the client's build files,
the protos) and never drops an extra that is there. The install itself, and that
the README runs on a runtime-only venv, is tests/docs/test_readme.py's fresh clone."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNTIME: frozenset[str] = frozenset()
DEV = frozenset({"dev"})


def _load_dev_script(path: Path = ROOT / "dev.py") -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"dev_script_{abs(hash(path))}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


dev = _load_dev_script()


def _stamp(inputs: str, *extras: str) -> str:
    return json.dumps({"inputs": inputs, "extras": sorted(extras)})


def test_each_command_needs_its_own_extras() -> None:
    assert dev.EXTRAS == {"serve": RUNTIME, "test": DEV}


def test_a_fresh_venv_installs_what_the_command_needs() -> None:
    assert dev.extras_to_install(None, "a", RUNTIME) == RUNTIME
    assert dev.extras_to_install(None, "a", DEV) == DEV


def test_the_same_inputs_install_nothing_when_the_extras_are_there() -> None:
    assert dev.extras_to_install(_stamp("a"), "a", RUNTIME) is None
    assert dev.extras_to_install(_stamp("a", "dev"), "a", DEV) is None
    # serve after test: the dev extra covers the runtime.
    assert dev.extras_to_install(_stamp("a", "dev"), "a", RUNTIME) is None


def test_test_after_serve_adds_the_dev_extra() -> None:
    assert dev.extras_to_install(_stamp("a"), "a", DEV) == DEV


def test_changed_inputs_reinstall_and_keep_the_extras_there() -> None:
    assert dev.extras_to_install(_stamp("a"), "b", RUNTIME) == RUNTIME
    assert dev.extras_to_install(_stamp("a", "dev"), "b", RUNTIME) == DEV


def test_an_older_dev_scripts_bare_digest_stamp_counts_as_the_dev_extra() -> None:
    digest = "0" * 64
    assert dev.extras_to_install(digest, digest, DEV) is None
    assert dev.extras_to_install(digest, "f" * 64, RUNTIME) == DEV


def test_an_unreadable_stamp_installs_again() -> None:
    assert dev.extras_to_install("{not json", "a", RUNTIME) == RUNTIME
    assert dev.extras_to_install(json.dumps({"extras": []}), "a", DEV) == DEV


@pytest.mark.parametrize(
    "changed",
    ["pyproject.toml", "VERSION", "clients/python/pyproject.toml",
     "clients/python/hatch_build.py", "protos/switchboard/session/v1/session_service.proto"],
)  # fmt: skip
def test_every_install_input_changes_the_digest(tmp_path: Path, changed: str) -> None:
    for name in ["dev.py", "pyproject.toml", "VERSION", "clients/python/pyproject.toml",
                 "clients/python/hatch_build.py"]:  # fmt: skip
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "protos", tmp_path / "protos")
    copy = _load_dev_script(tmp_path / "dev.py")
    before = copy._inputs_digest()
    with (tmp_path / changed).open("a") as edited:
        edited.write("\n")
    assert copy._inputs_digest() != before


def test_serve_names_the_checkouts_var_unless_the_caller_named_a_data_directory() -> None:
    """`switchboard serve` never falls back on the current directory: dev.py names
    the checkout's var/ for it, and leaves a caller's SWITCHBOARD_DATA_DIR alone."""
    assert dev.environment("serve", {"PATH": "/bin"}) == {
        "PATH": "/bin",
        "SWITCHBOARD_DATA_DIR": str(ROOT / "var"),
    }
    chosen = {"SWITCHBOARD_DATA_DIR": "/srv/switchboard"}
    assert dev.environment("serve", chosen) == chosen
    assert "SWITCHBOARD_DATA_DIR" not in dev.environment("test", {"PATH": "/bin"})


def test_the_whole_suite_runs_on_workers_and_a_chosen_part_as_asked() -> None:
    whole = dev._command("test", [])
    assert whole[:2] == ["-m", "pytest"] and "--dist" in whole
    workers = int(whole[whole.index("-n") + 1])
    assert 2 <= workers <= dev.MAX_TEST_WORKERS
    assert dev._command("test", ["-k", "claim"]) == ["-m", "pytest", "-k", "claim"]
