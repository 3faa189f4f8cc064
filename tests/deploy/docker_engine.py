"""A Docker engine of the test's own, and the official images the deployment uses:
`python:3.11-slim`, which k8s/Dockerfile builds FROM, and `postgres:15`, the
compose file's database.

The test starts `dockerd` itself (its socket and run state under a temporary
directory, its image store under CACHE so layers survive between runs on one
machine) and stops it by pid. Docker Hub is unreachable on the CI machines: when an
image can be neither found nor pulled, an equivalent is made from Debian's own
packages with debootstrap minbase and imported under that name. Python 3.11 with a
venv at /usr/local (so `python` and `pip` are on PATH as in the official image) and
the host's locally added CA certificates (so pip can reach PyPI through this
network); PostgreSQL 15 with an entrypoint of the official image's interface
(postgres_standin_entrypoint.sh). Each root filesystem is cached as a tarball
under CACHE, and the imported image carries its recipe's key as a label, so a
changed recipe is imported again.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("SWITCHBOARD_CI_CACHE", "/var/cache/switchboard-ci"))
STANDIN_SUITE = "bookworm"  # Debian's Python 3.11 and PostgreSQL 15, as in the images
LOCAL_CA_DIR = Path("/usr/local/share/ca-certificates")
HERE = Path(__file__).resolve().parent
STANDIN_LABEL = "switchboard.standin"


@dataclass(frozen=True)
class Standin:
    """How an official image is stood in for from Debian's packages."""

    #: Bump to rebuild this stand-in everywhere, e.g. after changing `prepare` (the
    #: packages, the suite, the copied files and the trusted CAs are in the key).
    recipe: str
    packages: str  # debootstrap --include
    env: dict[str, str]
    #: Further Dockerfile instructions `docker import` applies (CMD, ENTRYPOINT, ...).
    changes: tuple[str, ...]
    #: Commands run in the root filesystem once the packages are in.
    prepare: tuple[tuple[str, ...], ...] = ()
    #: Files of this directory copied into the root filesystem (path there -> name here).
    files: tuple[tuple[str, str], ...] = ()
    trusts_local_cas: bool = False


PYTHON_STANDIN = Standin(
    recipe="1",
    packages="python3,python3-venv,ca-certificates",
    env={"PATH": "/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
    changes=('CMD ["python3"]',),
    prepare=(("python3", "-m", "venv", "/usr/local"),),
    trusts_local_cas=True,
)
POSTGRES_STANDIN = Standin(
    recipe="1",
    packages="postgresql-15",
    env={
        "PATH": "/usr/lib/postgresql/15/bin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "PGDATA": "/var/lib/postgresql/data",
    },
    changes=(
        'ENTRYPOINT ["docker-entrypoint.sh"]', 'CMD ["postgres"]', "EXPOSE 5432",
        "VOLUME /var/lib/postgresql/data",
    ),
    prepare=(
        # The package's post-install made a cluster of its own; the entrypoint makes
        # one at the first start, in PGDATA, as the official image does.
        ("rm", "-rf", "/var/lib/postgresql/15", "/etc/postgresql/15"),
        # About 200 MB that no test reads: the JIT (postgres runs without it when it
        # cannot load it), docs, manuals and translations.
        ("sh", "-c", "rm -rf /usr/lib/*/libLLVM-14.so* /usr/lib/postgresql/15/lib/llvmjit* "
         "/usr/lib/postgresql/15/lib/bitcode /usr/share/doc /usr/share/man /usr/share/locale"),
    ),
    files=(("usr/local/bin/docker-entrypoint.sh", "postgres_standin_entrypoint.sh"),),
)  # fmt: skip
STANDINS = {"python:3.11-slim": PYTHON_STANDIN, "postgres:15": POSTGRES_STANDIN}


def docker_required() -> bool:
    """In CI the image tests must run; elsewhere they may skip."""
    return os.environ.get("CI", "").lower() in ("1", "true") or os.environ.get(
        "SWITCHBOARD_REQUIRE_DOCKER", ""
    ) in ("1", "true")


def _binary(name: str) -> str | None:
    return shutil.which(name) or next(
        (str(path) for d in ("/usr/sbin", "/usr/bin") if (path := Path(d) / name).exists()), None
    )


def missing_tools() -> list[str]:
    return [name for name in ("dockerd", "docker", "debootstrap") if _binary(name) is None]


def install_tools() -> None:
    """Debian's docker.io and debootstrap, with apt-get (update first if needed)."""
    packages = ["docker.io", "debootstrap"]
    command = ["apt-get", "install", "-y", "-q", *packages]
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(command, env=environment, capture_output=True, check=False).returncode:
        subprocess.run(
            ["apt-get", "update", "-q"], env=environment, capture_output=True, check=True
        )
        subprocess.run(command, env=environment, capture_output=True, check=True)


def apt_mirror() -> str:
    """The Debian mirror this machine's apt uses (deb822 or one-line sources)."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        if not path.is_file():
            continue
        text = path.read_text()
        for uri in re.findall(r"^URIs:\s*(\S+)", text, re.MULTILINE) + re.findall(
            r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)", text, re.MULTILINE
        ):
            if "security" not in uri:
                return str(uri)
    return "http://deb.debian.org/debian"


@contextmanager
def machine_lock(name: str) -> Iterator[None]:
    """One holder per machine: two runs must not share one engine's state or bridge."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@dataclass
class Engine:
    """A running dockerd and the matching CLI pointed at it."""

    socket: Path
    process: subprocess.Popen[bytes]
    log: Path
    cli: str

    def run(
        self, *args: str | Path, timeout: float = 120, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.cli, "-H", f"unix://{self.socket}", *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            input=input,
            env={**os.environ, "DOCKER_BUILDKIT": "1"},
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"docker {' '.join(map(str, args))} exited {result.returncode}\n"
                f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
            )
        return result

    def out(self, *args: str | Path, timeout: float = 120) -> str:
        return self.run(*args, timeout=timeout).stdout.strip()


@contextmanager
def docker_engine() -> Iterator[Engine]:
    """Starts dockerd (state under CACHE/docker, socket under a temp dir); stops it."""
    dockerd, cli = _binary("dockerd"), _binary("docker")
    assert dockerd and cli
    # Debian's CLI, from the same package as the daemon, when there is one.
    cli = "/usr/bin/docker" if Path("/usr/bin/docker").exists() else cli
    with machine_lock("docker"), tempfile.TemporaryDirectory(prefix="sb-docker-") as run_dir:
        socket = Path(run_dir) / "docker.sock"
        log = CACHE / "dockerd.log"
        with open(log, "wb") as output:
            process = subprocess.Popen(
                [dockerd, "--data-root", CACHE / "docker", "--exec-root", Path(run_dir) / "exec",
                 "--pidfile", Path(run_dir) / "docker.pid", "-H", f"unix://{socket}"],
                stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        engine = Engine(socket, process, log, cli)
        try:
            deadline = time.monotonic() + 60
            while engine.run("version", check=False, timeout=10).returncode != 0:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"dockerd did not start:\n{log.read_text()[-4000:]}")
                time.sleep(0.5)
            yield engine
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)
            _unmount_below(Path(run_dir))


def _unmount_below(directory: Path) -> None:
    """dockerd leaves its network namespace bind-mounted under its exec root."""
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for mount in sorted((m for m in mounts if m.startswith(f"{directory}/")), reverse=True):
        subprocess.run(["umount", "--lazy", mount], check=False, capture_output=True)


def base_images(dockerfile: Path) -> list[str]:
    """The external images a Dockerfile builds FROM (not its own stages)."""
    stages: set[str] = set()
    images: list[str] = []
    for match in re.finditer(
        r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", dockerfile.read_text(), re.M | re.I
    ):
        image, stage = match.group(1), match.group(2)
        if image not in stages and image not in images:
            images.append(image)
        if stage:
            stages.add(stage)
    return images


def _rootfs_key(standin: Standin) -> str:
    digest = hashlib.sha256(f"{standin.recipe} {STANDIN_SUITE} {standin.packages}".encode())
    for certificate in sorted(LOCAL_CA_DIR.glob("*.crt")) if standin.trusts_local_cas else []:
        digest.update(certificate.read_bytes())
    for target, name in standin.files:
        digest.update(f"{target} {name}".encode() + (HERE / name).read_bytes())
    return digest.hexdigest()[:16]


def _image_key(standin: Standin) -> str:
    """The root filesystem's key and what the import adds to it."""
    added = [f"{name}={value}" for name, value in standin.env.items()] + list(standin.changes)
    return hashlib.sha256(" ".join([_rootfs_key(standin), *added]).encode()).hexdigest()[:16]


def _chroot(rootfs: Path, *command: str) -> None:
    subprocess.run(["chroot", str(rootfs), *command], check=True, capture_output=True, timeout=300)


def build_standin_rootfs(standin: Standin, tarball: Path) -> None:
    """debootstrap a minimal Debian with the stand-in's packages and pack it as a tarball."""
    with tempfile.TemporaryDirectory(prefix="standin-", dir=CACHE) as work:
        rootfs = Path(work) / "rootfs"
        subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={standin.packages}", STANDIN_SUITE,
             str(rootfs), apt_mirror()],
            check=True, capture_output=True, timeout=900,
        )  # fmt: skip
        for command in standin.prepare:
            _chroot(rootfs, *command)
        for inside, name in standin.files:
            shutil.copy2(HERE / name, rootfs / inside)
        if standin.trusts_local_cas:
            for certificate in sorted(LOCAL_CA_DIR.glob("*.crt")):
                target = rootfs / "usr/local/share/ca-certificates" / certificate.name
                shutil.copy2(certificate, target)
            _chroot(rootfs, "update-ca-certificates")
        for leftovers in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (rootfs / leftovers).glob("*"):
                if path.is_file():
                    path.unlink()
        partial = tarball.with_suffix(".partial")
        subprocess.run(
            ["tar", "-C", str(rootfs), "-cf", str(partial), "."], check=True, timeout=300
        )
        partial.rename(tarball)


def ensure_base_image(engine: Engine, image: str) -> str:
    """Makes `image` present: already there (the real one, or this recipe's stand-in),
    pulled, or the cached or freshly built stand-in imported under its name. Returns
    which."""
    standin = STANDINS.get(image)
    assert standin is not None, f"no stand-in recipe for {image}: add one to STANDINS"
    key = _image_key(standin)
    label = f'{{{{index .Config.Labels "{STANDIN_LABEL}"}}}}'
    present = engine.run("image", "inspect", "--format", label, image, check=False)
    if present.returncode == 0 and present.stdout.strip() in ("", "<no value>", key):
        return "present"
    if (
        present.returncode != 0
        and engine.run("pull", image, check=False, timeout=120).returncode == 0
    ):
        return "pulled"
    with machine_lock("standin"):
        slug = image.replace(":", "-").replace("/", "_")
        tarball = CACHE / f"standin-{slug}-{_rootfs_key(standin)}.tar"
        how = "imported the cached stand-in"
        if not tarball.exists():
            for stale in CACHE.glob(f"standin-{slug}-*.tar"):
                stale.unlink()
            build_standin_rootfs(standin, tarball)
            how = "built and imported a stand-in"
        changes: Sequence[str] = [
            *(f"--change=ENV {name}={value}" for name, value in standin.env.items()),
            *(f"--change={change}" for change in standin.changes),
            f"--change=LABEL {STANDIN_LABEL}={key}",
        ]
        engine.run("import", *changes, tarball, image, timeout=300)
    return how
