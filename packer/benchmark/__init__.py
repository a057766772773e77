"""Commands that run both sides of packer, packing and reading back: ``packer bench`` (is data
loading the bottleneck? ``run``, with ``measure``, ``fresh``, ``threads``, ``report``,
``fidelity``; the write path in ``write``; video packs in ``video``) and ``packer demo``.

They sit above ``packer.commands`` (they pack through it) and import ``packer.data`` to read,
which the conversion commands never do; ``packer.api`` calls them (``packer.bench``,
``packer.demo``).
"""
