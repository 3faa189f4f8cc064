"""The OpenAI Agents SDK's source distribution, as PyPI publishes it: downloaded once
from PyPI's simple index, checked against its pinned digest, unpacked into a cache
directory. Its `tests/` is what `test_sdk_session_tests.py` runs against our session."""

from __future__ import annotations

import hashlib
import re
import shutil
import tarfile
import tempfile
import urllib.request
from pathlib import Path

VERSION = "0.24.0"  # the pin of clients/python/pyproject.toml's openai-agents extra
ARCHIVE = f"openai_agents-{VERSION}.tar.gz"
#: PyPI's digest of the archive (the simple index lists it with the link).
SHA256 = "4b4b285f4fed81fdf1b4ac426a9101658d9cd29b4fb1aaeee18f639b77e704e3"
SIMPLE_INDEX = "https://pypi.org/simple/openai-agents/"


def unpacked_sdist(cache_dir: Path) -> Path:
    """The unpacked sdist's root (with `tests/memory`), downloading it if the cache
    has no verified copy."""
    root = cache_dir / f"openai_agents-{VERSION}"
    if (root / "tests" / "memory").is_dir():
        return root
    archive = cache_dir / ARCHIVE
    if not archive.exists() or _digest(archive) != SHA256:
        _download(archive)
    with tempfile.TemporaryDirectory(dir=cache_dir) as scratch, tarfile.open(archive) as tar:
        tar.extractall(scratch, filter="data")
        shutil.move(str(Path(scratch) / root.name), root)
    return root


def _download(archive: Path) -> None:
    with urllib.request.urlopen(SIMPLE_INDEX, timeout=60) as answer:
        index = answer.read().decode()
    links = re.findall(rf'href="([^"]*/{re.escape(ARCHIVE)})#sha256=([0-9a-f]+)"', index)
    if not links:
        raise RuntimeError(f"{SIMPLE_INDEX} lists no {ARCHIVE}")
    [(url, listed)] = links[:1]
    if listed != SHA256:
        raise RuntimeError(f"PyPI lists sha256 {listed} for {ARCHIVE}, pinned {SHA256}")
    partial = archive.with_suffix(".partial")
    with urllib.request.urlopen(url, timeout=120) as answer, partial.open("wb") as out:
        shutil.copyfileobj(answer, out)
    if _digest(partial) != SHA256:
        partial.unlink()
        raise RuntimeError(f"the downloaded {ARCHIVE} does not match its pinned sha256")
    partial.replace(archive)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
