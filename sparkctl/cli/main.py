"""The entry point: the root group with every command group registered, and ``main``.

``main`` is the one place an error becomes a message and an exit code. Command
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
from sparkctl.cli import fabric as _fabric  # noqa: F401
from sparkctl.cli import image as _image  # noqa: F401
from sparkctl.cli import weights as _weights  # noqa: F401
from sparkctl.cli.base import cli
from sparkctl.errors import SparkctlError


def main(argv: list[str] | None = None) -> int:
    try:
        cli.main(args=argv, prog_name="sparkctl", standalone_mode=False)
        return 0
    except SparkctlError as exc:
        click.echo(f"error: {exc.one_line()}", err=True)
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except SystemExit as exc:
        return int(exc.code or 0)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug: say so plainly, traceback only on request
        if os.environ.get("SPARKCTL_DEBUG"):
            raise
        click.echo(f"internal error: {type(exc).__name__}: {exc} "
                   "(a sparkctl bug; rerun with SPARKCTL_DEBUG=1 for the traceback)", err=True)
        return 70


if __name__ == "__main__":
    sys.exit(main())
