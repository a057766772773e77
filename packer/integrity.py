"""Checksums: CRC32C (hardware accelerated through the `crc32c` package) and the TFRecord mask."""
from __future__ import annotations

import crc32c as _crc32c

__all__ = ["crc32c", "masked_crc32c"]


def crc32c(data: bytes | memoryview) -> int:
    """CRC32C (Castagnoli) of ``data`` as an unsigned 32-bit int."""
    return _crc32c.crc32c(data)


def masked_crc32c(data: bytes | memoryview) -> int:
    """The TFRecord framing checksum: a rotated CRC32C plus a constant, mod 2**32."""
    c = _crc32c.crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF
