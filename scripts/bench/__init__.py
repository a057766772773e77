"""packer's benchmarks, one script per question (see scripts/README.md)."""
