"""packer.codecs.image.to_chw: the fast HWC -> CHW copy used by decode="tensor"."""
from __future__ import annotations

import numpy as np
import pytest

from packer.codecs.image import to_chw


@pytest.mark.parametrize("shape", [(5, 7, 3), (224, 224, 3), (4, 6, 4), (3, 2, 1), (8, 9, 2)])
def test_to_chw_matches_transpose(shape):
    arr = np.random.default_rng(0).integers(0, 256, size=shape, dtype=np.uint8)
    for view in (arr, arr[:, ::-1]):  # contiguous and strided inputs
        out = to_chw(view)
        assert out.flags.c_contiguous and out.flags.writeable
        assert np.array_equal(out, view.transpose(2, 0, 1))
