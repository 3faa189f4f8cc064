"""A Docker engine of the test's own, and the base image k8s/Dockerfile builds FROM.

The test starts `dockerd` itself (its socket and run state under a temporary
directory, its image store under CACHE so layers survive between runs on one
machine) and stops it by pid. Docker Hub is unreachable on the CI machines: when
`python:3.11-slim` can be neither found nor pulled, an equivalent is made from
Debian's own Python 3.11 (debootstrap minbase, a venv at /usr/local so `python` and
`pip` are on PATH as in the official image, the host's locally added CA
certificates so pip can reach PyPI through this network) and imported under that
name. Its root filesystem is cached as a tarball under CACHE.
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
# Bump to rebuild cached stand-in base images everywhere.
STANDIN_RECIPE = "1"
STANDIN_SUITE = "bookworm"  # Debian's Python 3.11, as in python:3.11-slim
STANDIN_PACKAGES = "python3,python3-venv,ca-certificates"
STANDIN_ENV = {
    "PATH": "/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
}
LOCAL_CA_DIR = Path("/usr/local/share/ca-certificates")


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


def _standin_key() -> str:
    digest = hashlib.sha256(f"{STANDIN_RECIPE} {STANDIN_SUITE} {STANDIN_PACKAGES}".encode())
    for certificate in sorted(LOCAL_CA_DIR.glob("*.crt")):
        digest.update(certificate.read_bytes())
    return digest.hexdigest()[:16]


def _chroot(rootfs: Path, *command: str) -> None:
    subprocess.run(["chroot", str(rootfs), *command], check=True, capture_output=True, timeout=300)


def build_standin_rootfs(tarball: Path) -> None:
    """debootstrap a minimal Debian with Python 3.11 and pack it as a tarball."""
    with tempfile.TemporaryDirectory(prefix="standin-", dir=CACHE) as work:
        rootfs = Path(work) / "rootfs"
        subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={STANDIN_PACKAGES}", STANDIN_SUITE,
             str(rootfs), apt_mirror()],
            check=True, capture_output=True, timeout=900,
        )  # fmt: skip
        _chroot(rootfs, "python3", "-m", "venv", "/usr/local")
        for certificate in sorted(LOCAL_CA_DIR.glob("*.crt")):
            shutil.copy2(certificate, rootfs / "usr/local/share/ca-certificates" / certificate.name)
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
    """Makes `image` present: already there, pulled, or the cached or freshly built
    stand-in imported under its name. Returns which."""
    if engine.run("image", "inspect", image, check=False).returncode == 0:
        return "present"
    if engine.run("pull", image, check=False, timeout=120).returncode == 0:
        return "pulled"
    with machine_lock("standin"):
        tarball = (
            CACHE / f"standin-{image.replace(':', '-').replace('/', '_')}-{_standin_key()}.tar"
        )
        how = "imported the cached stand-in"
        if not tarball.exists():
            for stale in CACHE.glob("standin-*.tar"):
                stale.unlink()
            build_standin_rootfs(tarball)
            how = "built and imported a stand-in"
        changes: Sequence[str] = [
            *(f"--change=ENV {name}={value}" for name, value in STANDIN_ENV.items()),
            '--change=CMD ["python3"]',
        ]
        engine.run("import", *changes, tarball, image, timeout=300)
    return how
