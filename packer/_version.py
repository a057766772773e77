"""The package version (one place: the manifest records it, ``packer --version`` prints it)."""
__version__ = "0.1.0"
