"""`python -m fatpipe.cli` runs the CLI, for machines where the console script is not on PATH."""

from .main import cli

cli(prog_name="fatpipe")
