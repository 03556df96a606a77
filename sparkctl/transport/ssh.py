"""The old import path, kept so callers keep working: ``sparkctl.transport.ssh`` is ``sparkctl.transport``.

The transport used to be this one module on paramiko; it is now the package
``sparkctl.transport`` on fabric (see its docstring). New code imports from
``sparkctl.transport``. The underscore names are the test suite's old handles
on internals (the put script, the wire command, the host-key policy).
"""

from sparkctl.transport import *
from sparkctl.transport import __all__ as _public
from sparkctl.transport.base import PUT_SCRIPT as _PUT_SCRIPT
from sparkctl.transport.base import wire_command as _wire_command
from sparkctl.transport.hostkeys import RejectUnknown as _RejectUnknown
from sparkctl.transport.hostkeys import UnknownHostKey as _UnknownHostKey

__all__ = list(_public)
_ALIASES = (_PUT_SCRIPT, _RejectUnknown, _UnknownHostKey, _wire_command)
