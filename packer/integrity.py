"""Checksums: CRC32C (hardware accelerated through the `crc32c` package) and the TFRecord mask."""
from __future__ import annotations

import crc32c as _crc32c

__all__ = ["crc32c", "mask_crc", "masked_crc32c"]


def crc32c(data: bytes | memoryview, value: int = 0) -> int:
    """CRC32C (Castagnoli) of ``data`` as an unsigned 32-bit int; ``value``: the CRC32C of the
    bytes before ``data`` (to checksum a message given in pieces)."""
    return _crc32c.crc32c(data, value)


def mask_crc(c: int) -> int:
    """The TFRecord mask of a CRC32C: rotated right by 15 bits plus a constant, mod 2**32."""
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def masked_crc32c(data: bytes | memoryview) -> int:
    """The TFRecord framing checksum: a rotated CRC32C plus a constant, mod 2**32."""
    return mask_crc(_crc32c.crc32c(data))
