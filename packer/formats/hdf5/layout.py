"""HDF5 format: dataset names, chunking and the file signature (shared by writer and reader)."""
from __future__ import annotations

from pathlib import Path

__all__ = ["MANIFEST_ATTR", "HDF5_SIGNATURE", "HDF5_SUFFIXES", "BLOB_CHUNK", "TABLE_CHUNK", "H5_ERRORS",
           "has_signature"]

MANIFEST_ATTR = "packer_manifest"
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf", ".he5")
BLOB_CHUNK = 1 << 20
TABLE_CHUNK = 1 << 13
H5_ERRORS = (OSError, KeyError, ValueError, RuntimeError, TypeError)


def has_signature(path: Path) -> bool:
    """HDF5's signature sits at offset 0, 512, 1024, 2048, ... (after an optional user block)."""
    try:
        with open(path, "rb") as f:
            for at in [0] + [512 << k for k in range(8)]:
                f.seek(at)
                head = f.read(8)
                if len(head) < 8:
                    return False
                if head == HDF5_SIGNATURE:
                    return True
    except OSError:
        return False
    return False
