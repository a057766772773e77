"""Where a run's inputs and outputs may lie: never the same, never one inside the other.

Every command that reads inputs and writes an output (``pack``, ``decode_frames``,
``pack_videos``, ``resize``, ``merge``) calls :func:`check_placement` where the library call is
made, before it claims or touches anything:

- a tree it walks (a ``SRC`` without a list) may not be, contain or lie inside an output: an
  output inside it would be read as input by this run or the next (``fr/`` read as a class), an
  output holding it would be deleted by ``--overwrite``;
- any other input (a list or CSV file, a list's root, a class index, a merge's part) may not be
  or lie inside an output (``--overwrite`` would delete it); an output may lie inside a list's
  root, since a list names its inputs and the root is not walked.

Paths are compared resolved (``..``, trailing ``/``, relative or absolute, symlinks) and by the
identity of the folders on the way (a bind mount or another spelling of one folder). A walk
also leaves out any folder that holds a packer output or partial output (:func:`is_output_folder`),
however it got there. ``--overwrite`` replaces only what :func:`is_packer_output` recognises.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Optional, Union

from packer.errors import UsageError

__all__ = ["check_placement", "is_output_folder", "is_packer_output", "OUTPUT_MARKERS"]

PathLike = Union[str, "os.PathLike[str]"]

# Names only a packer output (finished, partial or a resize mirror) holds: its manifest, the run
# token and resume checkpoint of a partial output, and the resize mirror's state file.
OUTPUT_MARKERS = frozenset({"packer.json", ".run-token", ".resume.json", ".packer-resize.json"})


def is_output_folder(names: Iterable[str]) -> bool:
    """Whether a folder whose entries are ``names`` is a packer output (finished or partial)."""
    return not OUTPUT_MARKERS.isdisjoint(names)


def _identity(path: Path) -> Optional[tuple[int, int]]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _chain(path: Path) -> list[tuple[int, int]]:
    """The identities of ``path`` (when it exists) and of every existing folder above it."""
    found = []
    for p in (path, *path.parents):
        ident = _identity(p)
        if ident is not None:
            found.append(ident)
    return found


def _relation(a: Path, b: Path) -> Optional[str]:
    """How ``a`` stands to ``b``: ``"is"``, ``"lies inside"``, ``"contains"`` or None (apart)."""
    ra, rb = a.resolve(), b.resolve()
    ia, ib = _identity(ra), _identity(rb)
    if ra == rb or (ia is not None and ia == ib):
        return "is"
    if rb in ra.parents or (ib is not None and ib in _chain(ra.parent)):
        return "lies inside"
    if ra in rb.parents or (ia is not None and ia in _chain(rb.parent)):
        return "contains"
    return None


def check_placement(outputs: Iterable[Optional[PathLike]], *, walked: Iterable[Optional[PathLike]] = (),
                    read: Iterable[Optional[PathLike]] = ()) -> None:
    """Refuse, before any work, outputs that would read or delete the run's own inputs.

    Args:
        outputs: what the run writes (its ``OUT``, a ``--list-out`` file); None and URLs are skipped.
        walked: the trees the run walks for inputs: apart from every output, either way.
        read: every other input path: neither an output nor inside one.

    Raises:
        UsageError: ``OUT: refusing an output that <is|contains|lies inside> the input SRC``.
    """
    from packer.remote.url import is_url

    def local(paths: Iterable[Optional[PathLike]]) -> list[Path]:
        return [Path(p) for p in paths if p is not None and not is_url(p)]

    walked, read = local(walked), local(read)
    for out in local(outputs):
        for src in walked + read:
            how = _relation(out, src)
            if how is None or (how == "lies inside" and src not in walked):
                continue
            raise UsageError(f"{out}: refusing an output that {how} the input {src} (a run never "
                             "reads or replaces its own input; choose an output outside it)")


def is_packer_output(path: PathLike) -> bool:
    """Whether ``path`` is a packer output that ``--overwrite`` may replace: a folder whose
    ``packer.json`` names a format (even a damaged one), an export folder (``packer export``:
    its ``export.json`` names an export version), or an HDF5 file packer wrote."""
    path = Path(path)
    if path.is_dir():
        for name, mark, kind in (("packer.json", "format", str), ("export.json", "export_version", int)):
            try:
                manifest = json.loads((path / name).read_bytes())
            except (OSError, ValueError):
                continue
            if isinstance(manifest, dict) and isinstance(manifest.get(mark), kind):
                return True
        return False
    if path.is_file():
        from packer.formats.hdf5.layout import MANIFEST_ATTR, has_signature

        if not has_signature(path):
            return False
        import h5py

        try:
            with h5py.File(path, "r") as f:
                return MANIFEST_ATTR in f.attrs
        except (OSError, ValueError):
            return False
    return False
