"""packer's checks: identical outputs, mmaction2 agreement, fault counts (see scripts/README.md)."""
