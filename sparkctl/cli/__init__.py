"""The command line: the only code that prints, prompts or exits."""

from sparkctl.cli.base import cli
from sparkctl.cli.main import main

__all__ = ["cli", "main"]
