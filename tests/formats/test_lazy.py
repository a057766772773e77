"""Readers without writers' weight: reading a packed output never imports a format's writer."""
from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from packer.formats import FORMATS, VIDEO_FORMATS
from packer.formats.sample import Sample
from tests.support import REPO


READ_PROGRAM = r"""
import json, sys
import packer.data
from packer.data import PackedDataset
out = {}
for path in sys.argv[1:]:
    ds = PackedDataset(path, decode="numpy")
    out[path] = [int(ds[i][1]) for i in range(len(ds))] + [list(ds[0][0].shape)]
writers = sorted(m for m in sys.modules if m.startswith("packer.formats") and m.endswith("writer"))
print(json.dumps({"read": out, "writers": writers}))
"""


def _jpeg(value: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((8, 12, 3), value, dtype=np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


def _pack_each_format(root: Path) -> dict[str, Path]:
    outs = {}
    for name in FORMATS:
        writer_cls = FORMATS[name][0]
        out = root / (f"{name}.h5" if writer_cls.single_file else name)
        with writer_cls(out, classes=["a", "b"]) as w:
            for i in range(3):
                w.add(Sample(f"k{i}", _jpeg(40 * i), "jpeg", i % 2, 8, 12, 3))
            w.close()
        outs[name] = out
    out = root / "frames"
    with VIDEO_FORMATS["frames"][0](out, classes=["a", "b"]) as w:
        for j in range(3):
            w.add(Sample(f"v/{j}", _jpeg(50 * j), "jpeg", 1, 8, 12, 3,
                         extra={"frame_dir": "b/v", "frame": j, "frames": 3}))
        w.close(videos=[{"key": "v", "frame_dir": "b/v", "start": 0, "length": 3, "label": 1,
                         "height": 8, "width": 12}])
    outs["frames"] = out
    return outs


def test_reading_imports_no_writer(tmp_path):
    outs = _pack_each_format(tmp_path)
    proc = subprocess.run([sys.executable, "-c", READ_PROGRAM, *map(str, outs.values())],
                          capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["writers"] == []
    for name, path in outs.items():
        labels_and_shape = got["read"][str(path)]
        assert labels_and_shape[-1] == [8, 12, 3], name
        assert labels_and_shape[:-1] == ([0, 1, 0] if name != "frames" else [1, 1, 1]), name
