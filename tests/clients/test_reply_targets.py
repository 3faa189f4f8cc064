"""The gateways' sealed reply targets (switchboard_client.reply_targets): the envelope,
what opens it and what does not, the key's checks, and the Node gateway opening what
the Python one sealed and the other way round."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from switchboard_client.reply_targets import (
    MAX_SEALED_BYTES,
    REPLY_KEY_ENV,
    ReplyKeyRefused,
    ReplySealer,
    ReplyTarget,
    TargetUnreadable,
    parse_key,
    reply_sealer,
)

from switchboard import validation

ROOT = Path(__file__).resolve().parents[2]
NODE = shutil.which("node")
KEY = bytes(range(7, 39))
TARGET = ReplyTarget("telegram", "-1001987654321", "17585")


def test_a_sealed_target_opens_with_its_key_only() -> None:
    sealer = ReplySealer(KEY.hex())
    sealed = sealer.seal(TARGET)
    assert sealed[0] == 1 and len(sealed) == 1 + 12 + 128 + 16, "version, nonce, padded body, tag"
    assert validation.sealed_target("t", sealed) == sealed, "the services take it"
    assert sealer.open(sealed) == TARGET
    assert sealer.seal(TARGET) != sealed, "a fresh nonce each time"
    assert b"1987654321" not in sealed and b"telegram" not in sealed
    with pytest.raises(TargetUnreadable, match="another key, or altered"):
        ReplySealer(os.urandom(32)).open(sealed)
    for at in (1, 13, len(sealed) - 1):  # the nonce, the body, the tag
        altered = bytearray(sealed)
        altered[at] ^= 1
        with pytest.raises(TargetUnreadable):
            sealer.open(bytes(altered))
    with pytest.raises(TargetUnreadable, match="envelope version 1"):
        sealer.open(b"-1001987654321")


def test_the_length_says_little_about_the_ids() -> None:
    sealer = ReplySealer(KEY)
    short = sealer.seal(ReplyTarget("telegram", "7", ""))
    longer = sealer.seal(ReplyTarget("telegram", "-1001987654321", "17585"))
    assert len(short) == len(longer), "padded to the same 128-byte block"
    widest = ReplyTarget("slack", "C" * 256, "T" * 256)
    assert len(sealer.seal(widest)) <= MAX_SEALED_BYTES
    with pytest.raises(ValueError, match="at most"):
        sealer.seal(ReplyTarget("slack", "é" * 256, "ü" * 256))


@pytest.mark.parametrize(
    "text",
    [
        KEY.hex(),
        KEY.hex().upper(),
        base64.b64encode(KEY).decode(),
        base64.urlsafe_b64encode(KEY).decode().rstrip("="),
        f"  {KEY.hex()}\n",
    ],
    ids=["hex", "HEX", "base64", "base64url unpadded", "with whitespace"],
)
def test_keys_are_32_bytes_in_hex_or_base64(text: str) -> None:
    assert parse_key(text) == KEY
    assert parse_key(KEY) == KEY, "or the bytes themselves"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "neither"),
        ("CHANGE-ME", "a placeholder"),
        ("change-me-to-a-random-key-of-32-bytes!", "neither"),
        (KEY.hex()[:62], "neither"),
        ("0" * 64, "not random"),
        (base64.b64encode(b"CHANGEME" * 4).decode(), "not random"),
        ((b"\x01\x02" * 16).hex(), "not random"),
    ],
    ids=["empty", "manifest placeholder", "a sentence", "31 bytes", "zeros", "word", "pattern"],
)
def test_short_and_placeholder_keys_are_refused_at_gateway_start(text: str, says: str) -> None:
    with pytest.raises(ReplyKeyRefused, match=says) as refused:
        ReplySealer(text)
    assert "openssl rand -hex 32" in str(refused.value)
    assert not text or text not in str(refused.value), "the key is never repeated back"


def test_the_key_comes_from_the_option_else_the_environment() -> None:
    other = os.urandom(32)
    sealed = ReplySealer(other).seal(TARGET)
    assert reply_sealer(None, {}) is None
    from_env = reply_sealer(None, {REPLY_KEY_ENV: other.hex()})
    assert from_env is not None and from_env.open(sealed) == TARGET
    from_option = reply_sealer(KEY, {REPLY_KEY_ENV: other.hex()})
    assert from_option is not None
    with pytest.raises(TargetUnreadable):
        from_option.open(sealed)
    with pytest.raises(ReplyKeyRefused):
        reply_sealer(None, {REPLY_KEY_ENV: "CHANGE-ME"})


@pytest.mark.skipif(NODE is None, reason="node not on PATH")
def test_the_node_gateway_opens_what_python_sealed_and_the_other_way_round() -> None:
    sealed = ReplySealer(KEY).seal(TARGET)
    script = f"""
        import {{ ReplySealer }} from './clients/node/src/reply-targets.js';
        const sealer = new ReplySealer('{KEY.hex()}');
        const opened = sealer.open(Buffer.from('{sealed.hex()}', 'hex'));
        const back = sealer.seal({{ platform: 'slack', chatId: 'D0123', threadId: '171.001' }});
        console.log(JSON.stringify({{ opened, back: back.toString('hex') }}));
    """
    assert NODE is not None
    result = subprocess.run(
        [NODE, "--input-type=module", "-e", script],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["opened"] == {
        "platform": "telegram",
        "chatId": "-1001987654321",
        "threadId": "17585",
    }
    back = ReplySealer(KEY).open(bytes.fromhex(answer["back"]))
    assert back == ReplyTarget("slack", "D0123", "171.001")
