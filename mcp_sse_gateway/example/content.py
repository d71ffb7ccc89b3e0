"""Fixed payloads of the example server: small media files and deterministic large texts."""

from __future__ import annotations

import base64
import hashlib
import random
import struct
import zlib


def _png_1x1(red: int, green: int, blue: int) -> bytes:
    """A valid one-pixel RGB PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)  # 1x1, 8-bit, truecolour
    pixels = zlib.compress(bytes([0, red, green, blue]))  # filter byte 0, one pixel
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


def _wav_silence(samples: int = 8, rate: int = 8000) -> bytes:
    """A valid mono 16-bit PCM WAV file of *samples* silent samples."""
    data = b"\x00\x00" * samples
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    return (
        b"RIFF"
        + struct.pack("<I", 4 + 8 + len(fmt) + 8 + len(data))
        + b"WAVE"
        + b"fmt "
        + struct.pack("<I", len(fmt))
        + fmt
        + b"data"
        + struct.pack("<I", len(data))
        + data
    )


PNG_BYTES = _png_1x1(255, 0, 0)
PNG_BASE64 = base64.b64encode(PNG_BYTES).decode("ascii")
WAV_BASE64 = base64.b64encode(_wav_silence()).decode("ascii")

_ASCII_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "data:", "id:", "retry:", "event:")
_UNICODE_WORDS = (
    "é",
    "ß",
    "€",
    "漢字",
    "ü",
    "Ω",
    "😀",
    "🚀",
    "\u00a0",
    "\u2028",
    "\uff46\uff55\uff4c\uff4c",
)
_LINE_BREAKS = ("\n", "\r", "\r\n")


def payload_text(
    size_bytes: int, *, multiline: bool = True, unicode: bool = True, seed: int = 0
) -> str:
    """The deterministic text ``big_payload`` returns: exactly *size_bytes* bytes of UTF-8.

    Words drawn by a generator seeded with *seed*, separated by spaces, with CR, LF and CRLF
    line breaks when *multiline*, and 2-, 3- and 4-byte UTF-8 characters when *unicode*. The
    same arguments always give the same text, so a client can compare it exactly.

    Args:
        size_bytes: length of the UTF-8 encoding of the result.
        multiline: include line breaks (all three styles).
        unicode: include multi-byte characters.
        seed: seed of the generator.

    Returns:
        The text.
    """
    if size_bytes <= 0:
        return ""
    vocabulary: list[str] = list(_ASCII_WORDS)
    weights: list[float] = [1.0] * len(vocabulary)
    if unicode:
        vocabulary += _UNICODE_WORDS
        weights += [0.6] * len(_UNICODE_WORDS)
    if multiline:
        vocabulary += _LINE_BREAKS
        weights += [0.7] * len(_LINE_BREAKS)
    vocabulary.append(" ")
    weights.append(3.0)
    rng = random.Random(seed)  # noqa: S311 - test data, not secrets
    # Tokens average more than two bytes: this many always covers size_bytes.
    tokens = rng.choices(vocabulary, weights=weights, k=size_bytes // 2 + 16)
    encoded = "".join(tokens).encode("utf-8")[:size_bytes]
    text = encoded.decode("utf-8", errors="ignore")  # drop a character cut at the end
    return text + "." * (size_bytes - len(text.encode("utf-8")))


def sha256_hex(text: str) -> str:
    """SHA-256 of the text's UTF-8 encoding, as 64 hex digits."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
