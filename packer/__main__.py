"""``python -m packer``: the same command line as the ``packer`` script."""
from .cli import main

main(prog_name="packer")
