"""Frames format: mmaction2 rawframes folders, the default output of ``decode-frames``.

Layout: ``{out}/{class}/{video}/img_00001.jpg`` (``filename_tmpl``/``start_index`` from the
manifest's ``extra``), the list file ``{out}/rawframes.txt`` (``{frame_dir} {total_frames}
{label}`` lines, mmaction2's ``RawframeDataset`` with ``data_prefix={out}``), ``packer.json``
(one ``videos`` entry per video, with ``frame_dir``), ``checksums.bin`` (u32 CRC32C of each
frame file by position) and ``failures.jsonl``. Frame folders hold only frame files.

Each video is written into a hidden temporary folder beside its final place and renamed
when its last frame is written, so a frame folder appears only complete. Video samples
carry ``extra = {"frame_dir", "frame" (0-based), "frames" (the video's count)}``, plus
``"file"`` (the file name) for optical-flow images.

Optical flow (``decode-frames --task flow|both``): a video's entry then has ``rgb_frames`` and
``flow_frames``; its samples are the RGB frames, then ``x``, ``y`` of each flow frame in turn,
named by the manifest's ``flow_tmpl`` (``{}_{:05d}.jpg``) in the same folder, and the flow list
``rawframes_flow.txt`` gives each folder's flow frame count (mmaction2's ``*_flow`` lists,
``RawframeDataset(modality='Flow', filename_tmpl='{}_{:05d}.jpg')``). A multi-label video
(``labels`` in its entry) lists all its labels, as mmaction2's multi-class lists do.
"""
from __future__ import annotations

from packer.formats.frames.layout import (DEFAULT_TEMPLATE, FLOW_LIST_NAME, LIST_NAME, check_template, list_files,
                                         rawframes_lines, video_streams)
from packer.formats.lazy import lazy_exports
from packer.formats.sidecars import CHECKSUMS_FILE
from packer.formats.spec import FormatSpec
from packer.manifest import FAILURES_NAME

__all__ = ["FORMAT", "FramesWriter", "FramesReader", "LIST_NAME", "FLOW_LIST_NAME", "DEFAULT_TEMPLATE", "check_template",
           "rawframes_lines", "video_streams", "list_files"]

FORMAT = FormatSpec(name="frames", writer="packer.formats.frames.writer:FramesWriter",
                    reader="packer.formats.frames.reader:FramesReader",
                    sidecars=(CHECKSUMS_FILE, LIST_NAME), optional=(FLOW_LIST_NAME, FAILURES_NAME),
                    refusal="frame folders are not read over URLs (thousands of small files); pack the "
                            "frames as records (`packer decode-frames --to records`) and read that")

__getattr__ = lazy_exports(__name__, {"FramesWriter": "packer.formats.frames.writer",
                                      "FramesReader": "packer.formats.frames.reader"})
