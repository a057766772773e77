"""packer's test suite: one folder per package of ``packer/``, helpers in ``support``."""
