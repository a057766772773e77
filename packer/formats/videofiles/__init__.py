"""Video files format: ``pack-videos --to files``, plain re-encoded MP4 files and an mmaction2 list.

Layout: ``{out}/{class}/{video}.mp4`` (the input tree, as ``decode-frames`` mirrors it into frame
folders: each video's ``frame_dir`` plus ``.mp4``), the list file ``{out}/videos.txt``
(``{file} {label}`` lines, every label of a multi-label video: mmaction2's ``VideoDataset`` with
``data_prefix=dict(video={out})``), ``packer.json`` (one ``videos`` entry per video, with ``file``),
``checksums.bin`` (u32 CRC32C of each MP4 by position) and ``failures.jsonl``.

Each MP4 is written under a hidden temporary name beside its final place and renamed when
complete, so a video file appears only whole; a journal of the files each commit made durable
lets ``--resume`` drop the rest. Samples carry ``extra = {"file"}``. The files hold no frame
index: a reader builds it from the MP4's packets (``packer.codecs.video_pack.index_mp4``).
"""
from __future__ import annotations

from packer.formats.lazy import lazy_exports
from packer.formats.sidecars import CHECKSUMS_FILE
from packer.formats.spec import FormatSpec

__all__ = ["FORMAT", "VideoFilesWriter", "VideoFilesReader", "LIST_NAME", "MP4_FMT", "list_text"]

LIST_NAME = "videos.txt"
MP4_FMT = "mp4"  # the Record.fmt of a plain video file


def list_text(videos: list) -> str:
    """The mmaction2 video list: ``{file} {label}`` per video (every label of a multi-label one)."""
    return "".join(f"{v['file']} {' '.join(str(x) for x in v.get('labels') or [v['label']])}\n" for v in videos)


FORMAT = FormatSpec(name="files", writer="packer.formats.videofiles.writer:VideoFilesWriter",
                    reader="packer.formats.videofiles.reader:VideoFilesReader",
                    sidecars=(CHECKSUMS_FILE, LIST_NAME))

__getattr__ = lazy_exports(__name__, {"VideoFilesWriter": "packer.formats.videofiles.writer",
                                      "VideoFilesReader": "packer.formats.videofiles.reader"})
