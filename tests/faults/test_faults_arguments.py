"""The library calls refuse a wrong type or value with one UsageError naming the parameter,
before they do anything (packer.arguments)."""
from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest

import packer
from packer.errors import UsageError
from tests.support.inputs import write_image_folder


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return write_image_folder(tmp_path_factory.mktemp("args") / "images", count=4, classes=2, size=(20, 24))


WRONG = [
    ("pack", {"workers": "2"}, "workers must be an integer or None, not '2' (str)"),
    ("pack", {"workers": True}, "workers must be an integer or None, not True (bool)"),
    ("pack", {"workers": -1}, "workers must be >= 0"),
    ("pack", {"resize": 256}, "resize must be a packer.ResizeSpec or None, not 256 (int)"),
    ("pack", {"format": "lmbd"}, "format must be one of lmdb, hdf5, records"),
    ("pack", {"check": "fulll"}, "check must be one of full, header, none"),
    ("pack", {"max_failures": 2.5}, "max_failures must be an integer, not 2.5"),
    ("pack", {"num_shards": 0}, "num_shards must be >= 1"),
    ("pack", {"overwrite": "yes"}, "overwrite must be True or False"),
    ("pack", {"shard_size": 1.5}, "shard_size must be an integer or a string"),
    ("pack", {"out": "."}, "out must name the output itself"),
    ("pack", {"out": ".."}, "out must name the output itself"),
    ("pack", {"src": 3}, "src must be a path, not 3 (int)"),
    ("decode_frames", {"fps": float("nan")}, "fps must be > 0"),
    ("decode_frames", {"quality": 0}, "quality must be in 1..100"),
    ("decode_frames", {"size": (1, 2, 3)}, "size must be a string or a tuple (an integer, an integer) or None"),
    ("pack_videos", {"gop": 0}, "gop must be >= 1"),
    ("pack_videos", {"short_side": 0}, "short_side must be >= 1"),
    ("resize", {"out": "s3://bucket/small"}, "out must be a local path"),
    ("resize", {"spec": None}, "spec must be a packer.ResizeSpec, not None"),
    ("merge", {"parts": "a.lmdb"}, "parts must be a list (each a path), not 'a.lmdb' (str)"),
    ("inspect", {"show": -1}, "show must be >= 0"),
    ("bench", {"workers": [0, -1]}, "workers must be >= 0"),
    ("demo", {"count": 0}, "count must be >= 1"),
]


def _call(name: str, given: dict, images: Path, tmp_path: Path):
    base = {"pack": {"src": images, "out": tmp_path / "o.lmdb", "workers": 0},
            "decode_frames": {"src": images, "out": tmp_path / "fr", "workers": 0},
            "pack_videos": {"src": images, "out": tmp_path / "v", "workers": 0},
            "resize": {"src": images, "out": tmp_path / "small", "spec": packer.ResizeSpec(short_side=8)},
            "merge": {"parts": [tmp_path / "a.lmdb"], "out": tmp_path / "m.lmdb"},
            "inspect": {"path": tmp_path / "a.lmdb"},
            "bench": {"path": tmp_path / "a.lmdb"},
            "demo": {"workdir": tmp_path / "demo"}}[name]
    return getattr(packer, name)(**{**base, **given})


@pytest.mark.parametrize("name,given,message", WRONG, ids=[f"{n}-{'-'.join(g)}" for n, g, _ in WRONG])
def test_a_wrong_argument_is_one_usage_error_naming_it(name, given, message, images, tmp_path):
    with pytest.raises(UsageError, match=f"^packer.{name}: ") as e:
        _call(name, given, images, tmp_path)
    assert message in str(e.value)
    assert list(tmp_path.iterdir()) == []  # refused before anything was made


def test_paths_numpy_integers_and_none_are_accepted(images, tmp_path):
    report = packer.pack(str(images), tmp_path / "o.lmdb", workers=np.int64(0), timeout=None,
                         resize=packer.ResizeSpec(short_side=16))
    assert report.count == 4


def test_the_signature_help_shows_is_the_functions_own():
    params = inspect.signature(packer.pack).parameters
    assert list(params)[:3] == ["src", "out", "format"] and params["workers"].default is None
    assert "Pack an image folder" in packer.pack.__doc__
