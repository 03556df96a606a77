"""The entry point: the root group with every command group registered, and ``main``.

``main`` is the one place an error becomes a message and an exit code (a member
of ``sparkctl.errors.ExitStatus``, the one table of them). Command
groups that ship outside the product (the simulated cluster's ``sim`` and
``demo``) register through the ``sparkctl.commands`` entry points and are loaded
only when named, so the product never imports them.
"""

from __future__ import annotations

import os
import sys

import click

from sparkctl.cli import bench as _bench  # noqa: F401 - registers its commands
from sparkctl.cli import cluster as _cluster  # noqa: F401
from sparkctl.cli import config as _config  # noqa: F401
from sparkctl.cli import discover as _discover  # noqa: F401
from sparkctl.cli import fabric as _fabric  # noqa: F401
from sparkctl.cli import fit as _fit  # noqa: F401
from sparkctl.cli import gateway as _gateway  # noqa: F401
from sparkctl.cli import image as _image  # noqa: F401
from sparkctl.cli import metrics as _metrics  # noqa: F401
from sparkctl.cli import weights as _weights  # noqa: F401
from sparkctl.cli.base import cli
from sparkctl.errors import ExitStatus, SparkctlError


def main(argv: list[str] | None = None) -> ExitStatus:
    """Run one command; every outcome becomes a member of the one table, ``ExitStatus``."""
    try:
        cli.main(args=argv, prog_name="sparkctl", standalone_mode=False)
        return ExitStatus.SUCCESS
    except SparkctlError as exc:
        click.echo(f"error: {exc.one_line()}", err=True)
        return exc.exit_code
    except click.exceptions.Exit as exc:  # --help, --version
        return _known(exc.exit_code)
    except SystemExit as exc:  # raised by code outside sparkctl (the demo passes its failed step's code on)
        if exc.code is not None and not isinstance(exc.code, int):
            click.echo(f"error: {exc.code}", err=True)
            return ExitStatus.ERROR
        return _known(exc.code or 0)
    except click.ClickException as exc:
        exc.show()
        return _known(exc.exit_code)  # UsageError: 2 (CONFIG), any other: 1 (ERROR)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return ExitStatus.INTERRUPTED
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return ExitStatus.INTERRUPTED
    except BrokenPipeError:
        return ExitStatus.SUCCESS
    except Exception as exc:  # a bug: say so plainly, traceback only on request
        if os.environ.get("SPARKCTL_DEBUG"):
            raise
        click.echo(f"internal error: {type(exc).__name__}: {exc} "
                   "(a sparkctl bug; rerun with SPARKCTL_DEBUG=1 for the traceback)", err=True)
        return ExitStatus.INTERNAL


def _known(code: int) -> ExitStatus:
    """A code from click or a SystemExit, as its member of the table; one outside it is a plain error."""
    try:
        return ExitStatus(code)
    except ValueError:
        return ExitStatus.ERROR


if __name__ == "__main__":
    sys.exit(main())
