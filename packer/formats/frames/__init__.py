"""Frames format: mmaction2 rawframes folders, the default output of ``decode-frames``.

Layout: ``{out}/{class}/{video}/img_00001.jpg`` (``filename_tmpl``/``start_index`` from the
manifest's ``extra``), the list file ``{out}/rawframes.txt`` (``{frame_dir} {total_frames}
{label}`` lines, mmaction2's ``RawframeDataset`` with ``data_prefix={out}``), ``packer.json``
(one ``videos`` entry per video, with ``frame_dir``), ``checksums.bin`` (u32 CRC32C of each
frame file by position) and ``failures.jsonl``. Frame folders hold only frame files.

Each video is written into a hidden temporary folder beside its final place and renamed
when its last frame is written, so a frame folder appears only complete. Video samples
carry ``extra = {"frame_dir", "frame" (0-based), "frames" (the video's count)}``.
"""
from __future__ import annotations

from packer.formats.frames.layout import DEFAULT_TEMPLATE, LIST_NAME, check_template, rawframes_lines
from packer.formats.lazy import lazy_exports

__all__ = ["FramesWriter", "FramesReader", "LIST_NAME", "DEFAULT_TEMPLATE", "check_template",
           "rawframes_lines"]

__getattr__ = lazy_exports(__name__, {"FramesWriter": "packer.formats.frames.writer",
                                      "FramesReader": "packer.formats.frames.reader"})
