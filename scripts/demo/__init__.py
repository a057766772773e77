"""Demonstrations of packer in a training loop (see scripts/README.md)."""
