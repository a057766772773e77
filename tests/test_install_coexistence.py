"""packer installed with its extras beside PyTurboJPEG: nothing shadows ``turbojpeg``.

The ``turbojpeg`` 0.0.2 wheel (the old ``turbo`` extra) installs a compiled module named
``turbojpeg``; in the same directory as PyTurboJPEG's ``turbojpeg.py`` the compiled module wins
and ``from turbojpeg import TurboJPEG`` (mmcv's backend) fails. This test builds packer's wheel,
downloads PyTurboJPEG and the ``turbo`` extra's requirements (with their dependencies) once per
session, installs PyTurboJPEG and then all of those into ONE fresh ``--target`` directory (no
system site-packages between them, so nothing already installed here hides a clash), and runs a
fresh interpreter with only that directory in front of the standard library's and this Python's
site-packages: PyTurboJPEG must still import, and the installed packer must pick simplejpeg and
give the pixels this checkout's reference decode gives; where this checkout decodes regions
through its extension on Pillow's libjpeg-turbo, the installed wheel must too, at the same pixels.

It needs PyPI (``pip download``): without it, it skips and says so.
"""
from __future__ import annotations

import email.parser
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from packaging.requirements import Requirement

from packer.codecs import image as imaging
from packer.synth import jpeg_bytes, natural_image

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow
EXTRAS = ("turbo",)  # the extras whose packages share site-packages with the field's stack


def _pip(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, timeout=timeout)


def _extra_requirements(wheel: Path, extras: tuple[str, ...]) -> list[str]:
    """The requirement strings the wheel's METADATA lists for ``extras`` (markers evaluated)."""
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(z.read(name).decode())
    out = []
    for line in meta.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker and any(req.marker.evaluate({"extra": e}) for e in extras) \
                and not req.marker.evaluate({"extra": ""}):
            req.marker = None
            out.append(str(req))
    return out


def _region_expected() -> bool:
    """Whether region decoding must be on in the installed packer: the wheel built its
    extension and this Python's Pillow is a wheel that bundles libjpeg-turbo."""
    from packer.codecs import jpeg_region

    return jpeg_region.backend() == "libjpeg" and bool(jpeg_region._pillow_libjpeg())


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory) -> dict[str, object]:
    """packer's wheel, PyTurboJPEG's and the extras' (with dependencies), built/downloaded once."""
    root = tmp_path_factory.mktemp("wheelhouse")
    own, deps = root / "packer", root / "deps"
    r = _pip("wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(own), str(REPO))
    assert r.returncode == 0, r.stderr[-2000:]
    wheel = next(own.glob("packer-*.whl"))
    extra = _extra_requirements(wheel, EXTRAS)
    assert extra, "the turbo extra lists no requirement"
    r = _pip("download", "-q", "--only-binary", ":all:", "-d", str(deps), "PyTurboJPEG>=2", *extra)
    if r.returncode != 0:
        pytest.skip(f"cannot download PyTurboJPEG and the extras' wheels (no PyPI?): "
                    f"{r.stderr.strip().splitlines()[-1:]}")
    return {"packer": wheel, "deps": deps, "extra": extra}


def test_pyturbojpeg_still_imports_and_pixels_are_unchanged(wheelhouse, tmp_path):
    target, deps = tmp_path / "site", wheelhouse["deps"]
    pyturbo = sorted(deps.glob("pyturbojpeg-*.whl")) + sorted(deps.glob("PyTurboJPEG-*.whl"))
    assert pyturbo, sorted(p.name for p in deps.iterdir())
    # the user's environment first: PyTurboJPEG
    r = _pip("install", "-q", "--no-index", "--no-deps", "--target", str(target), str(pyturbo[0]))
    assert r.returncode == 0, r.stderr[-2000:]
    assert (target / "turbojpeg.py").is_file()
    # then packer and everything its extras bring, into the same directory
    others = [str(p) for p in sorted(deps.glob("*.whl")) if p not in pyturbo]
    r = _pip("install", "-q", "--no-index", "--no-deps", "--upgrade", "--target", str(target),
             str(wheelhouse["packer"]), *others)
    assert r.returncode == 0, r.stderr[-2000:]
    clashes = sorted(p.name for p in target.iterdir() if p.name.startswith("turbojpeg") and p.name != "turbojpeg.py")
    assert not clashes, f"an extra installed a module named turbojpeg: {clashes}"

    rng = np.random.default_rng(35)
    images = [jpeg_bytes(natural_image(rng, h, w)) for h, w in ((60, 80), (97, 131), (240, 320))]
    for i, data in enumerate(images):
        (tmp_path / f"{i}.jpg").write_bytes(data)
    code = f"""
import json, sys
import numpy as np
from turbojpeg import TurboJPEG, TJPF_RGB
import turbojpeg, packer
from packer.codecs import image, jpeg_region
out = {{"turbojpeg": turbojpeg.__file__, "packer": packer.__file__, "decoder": image.DECODER,
       "region": jpeg_region.available(), "backend": jpeg_region.backend()}}
for i in range({len(images)}):
    data = open(r"{tmp_path}/{{}}.jpg".format(i), "rb").read()
    np.save(r"{tmp_path}/{{}}.npy".format(i), image.decode(data))
    if out["region"]:  # the whole image through region decoding, and a box of it
        np.save(r"{tmp_path}/{{}}-roi.npy".format(i), jpeg_region.decode_region(data, 0, 0, *jpeg_region.read_header(data)[:2]))
        np.save(r"{tmp_path}/{{}}-box.npy".format(i), jpeg_region.decode_region(data, 17, 9, 40, 30))
lib = out["lib"] = jpeg_region.library_path()
if out["backend"] == "turbojpeg":  # PyTurboJPEG works on the libturbojpeg packer found
    np.save(r"{tmp_path}/tj.npy", TurboJPEG(lib).decode(open(r"{tmp_path}/0.jpg", "rb").read(), pixel_format=TJPF_RGB))
print(json.dumps(out))
"""
    # a fresh interpreter that sees the target directory first, then this Python's own packages
    # (numpy and the rest of packer's core dependencies): never this checkout
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PACKER_DECODER")}
    env["PYTHONPATH"] = str(target)
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert Path(seen["turbojpeg"]) == target / "turbojpeg.py"
    assert Path(seen["packer"]).is_relative_to(target)
    assert seen["decoder"] == "simplejpeg"
    for i, data in enumerate(images):
        np.testing.assert_array_equal(np.load(tmp_path / f"{i}.npy"), imaging.decode_pil(data))
    if _region_expected():  # the wheel built packer.codecs._jpegroi: Pillow's libjpeg-turbo serves it
        assert seen["region"] and seen["backend"] == "libjpeg", seen
        assert "pillow.libs" in seen["lib"] or ".dylibs" in seen["lib"], seen
    if seen["region"]:
        for i, data in enumerate(images):
            ref = imaging.decode_pil(data)
            np.testing.assert_array_equal(np.load(tmp_path / f"{i}-roi.npy"), ref)
            np.testing.assert_array_equal(np.load(tmp_path / f"{i}-box.npy"), ref[9:39, 17:57])
    if seen["backend"] == "turbojpeg":
        np.testing.assert_array_equal(np.load(tmp_path / "tj.npy"), imaging.decode_pil(images[0]))
