"""Where the commands that open a database look: --data-dir, else SWITCHBOARD_DATA_DIR,
else `data_dir` in the config file; never the current directory unasked. A missing
database is an error saying where it looked and how to point elsewhere."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from switchboard_cli.main import main

#: A data directory in the current one, as `serve` used to make by default: it
#: must never be read unless named.
STRAY = "var"


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty current directory (but for a stray var/ with databases), no data
    directory variable and a config home of its own, empty."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("SWITCHBOARD_DATA_DIR", raising=False)
    monkeypatch.delenv("SWITCHBOARD_SESSION_DATABASE_URL", raising=False)
    monkeypatch.delenv("SWITCHBOARD_DELIVERY_DATABASE_URL", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert _cli("db", "migrate", "--data-dir", STRAY).exit_code == 0
    yield cwd


def _cli(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, ["--log-level", "WARNING", *args], env=env)


def _config(workdir: Path, text: str) -> Path:
    config = workdir.parent / "config" / "switchboard" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(text)
    return config


@pytest.mark.parametrize(
    "command",
    [("db", "status"), ("db", "migrate"), ("session", "rebuild"), ("serve",)],
    ids=" ".join,
)
def test_no_data_directory_named_is_a_usage_error_saying_how_to_name_one(
    workdir: Path, command: tuple[str, ...]
) -> None:
    before = sorted(path.name for path in (workdir / STRAY).iterdir())
    if command == ("serve",):  # a process: were it to serve, the timeout ends it
        exit_code, output = _installed_command(
            workdir, *command, "--session-listen", "127.0.0.1:0", "--delivery-listen", "127.0.0.1:0"
        )
    else:
        result = _cli(*command)
        exit_code, output = result.exit_code, result.output
    assert exit_code == 2, output
    said = " ".join(output.split())
    assert "no data directory" in said
    assert "--data-dir" in said and "SWITCHBOARD_DATA_DIR" in said
    assert str(workdir.parent / "config" / "switchboard" / "config.toml") in said
    assert sorted(path.name for path in (workdir / STRAY).iterdir()) == before, "untouched"
    assert [path.name for path in workdir.iterdir()] == [STRAY], "nothing made here"


def test_a_missing_database_is_an_error_naming_where_it_looked(workdir: Path) -> None:
    empty = workdir.parent / "empty"
    for via in (["--data-dir", str(empty)], []):
        env = None if via else {"SWITCHBOARD_DATA_DIR": str(empty)}
        origin = "--data-dir" if via else "SWITCHBOARD_DATA_DIR"
        status = _cli("db", "status", *via, env=env)
        assert status.exit_code == 1, status.output
        said = " ".join(status.output.split())
        for service in ("session", "delivery"):
            assert f"no {service} database at {empty / f'{service}.sqlite3'}" in said
            assert f"--{service}-database-url" in said
        assert f"(the data directory from {origin})" in said
        assert "Point elsewhere" in said and "`switchboard db migrate` makes" in said
        rebuild = _cli("session", "rebuild", *via, env=env)
        assert rebuild.exit_code == 1
        assert f"no session database at {empty / 'session.sqlite3'}" in rebuild.output
    assert not empty.exists(), "reading made nothing"


def test_one_database_missing_still_shows_the_other(workdir: Path) -> None:
    assert _cli("db", "migrate", "session", "--data-dir", "half").exit_code == 0
    status = _cli("db", "status", "--data-dir", "half")
    assert status.exit_code == 1
    assert "session (sqlite:///" in status.stdout and "up to date" in status.stdout
    assert "no delivery database at" in status.output


def test_the_config_file_names_the_data_directory_and_the_variable_and_flag_win(
    workdir: Path,
) -> None:
    config = _config(workdir, 'data_dir = "data"\n')
    made = _cli("db", "migrate")
    assert made.exit_code == 0, made.output
    configured = config.parent / "data"  # relative to the file, not to the current directory
    assert (configured / "session.sqlite3").exists()
    assert (configured / "delivery.sqlite3").exists()
    assert _cli("db", "status").stdout.count("up to date") == 2

    variable = _cli("db", "status", env={"SWITCHBOARD_DATA_DIR": str(workdir / "nowhere")})
    assert variable.exit_code == 1 and "from SWITCHBOARD_DATA_DIR" in variable.output
    flag = _cli(
        "db", "status", "--data-dir", STRAY, env={"SWITCHBOARD_DATA_DIR": str(workdir / "x")}
    )
    assert flag.exit_code == 0, flag.output
    assert str(workdir / STRAY / "session.sqlite3") in flag.stdout

    _config(workdir, f'data_dir = "{workdir / "absent"}"\n')
    absent = _cli("db", "status", "session")
    assert absent.exit_code == 1
    assert f"(the data directory from data_dir in {config})" in " ".join(absent.output.split())


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ('data-dir = "x"\n', "unknown settings (data-dir)"),
        ("data_dir = [\n", "cannot read the config file"),
        ("data_dir = 3\n", 'write data_dir = "/a/path"'),
    ],
)
def test_a_config_file_that_cannot_be_used_says_why(
    workdir: Path, text: str, complaint: str
) -> None:
    config = _config(workdir, text)
    result = _cli("db", "status")
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert str(config) in said and complaint in said


def test_database_urls_need_no_data_directory(database_url: str, workdir: Path) -> None:
    urls = ["--session-database-url", database_url, "--delivery-database-url", database_url]
    migrated = _cli("db", "migrate", *urls)
    assert migrated.exit_code == 0, migrated.output
    status = _cli("db", "status", *urls)
    assert status.exit_code == 0, status.output
    assert status.stdout.count("up to date") == 2


def _installed_command(cwd: Path, *args: str) -> tuple[int, str]:
    """The installed `switchboard` run in `cwd`: its exit code and what it printed."""
    command = Path(sys.executable).parent / "switchboard"
    done = subprocess.run(
        [str(command), *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )
    return done.returncode, done.stdout + done.stderr


def test_db_status_run_outside_the_checkout_as_a_person_would(workdir: Path) -> None:
    """The installed command in a directory of its own: an error, exit code 2."""
    exit_code, output = _installed_command(workdir, "db", "status")
    assert exit_code == 2, output
    assert "no data directory" in output and "Traceback" not in output
