"""The one compiled part: packer.codecs._jpegroi (csrc/jpegroi.c), region-of-interest JPEG
decoding through the libjpeg-turbo that Pillow's wheels bundle (docs/loading.md).

It needs a C compiler and Python's headers and nothing else (no JPEG library or its headers:
csrc/libjpeg holds libjpeg-turbo's). ``optional=True``: where it cannot be built, the install
still succeeds and region decoding falls back as ``packer.codecs.jpeg_region`` describes.
Everything else is in pyproject.toml.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("packer.codecs._jpegroi", ["csrc/jpegroi.c"], include_dirs=["csrc/libjpeg"],
                             depends=["csrc/libjpeg/jconfig.h", "csrc/libjpeg/jmorecfg.h",
                                      "csrc/libjpeg/jpeglib.h"],
                             optional=True)])
