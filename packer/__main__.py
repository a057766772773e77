"""``python -m packer``: the same command line as the ``packer`` script."""
from packer.cli import main

main(prog_name="packer")
