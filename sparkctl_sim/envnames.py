"""The environment variables the simulated cluster hands its shims, engines and units.

A leaf: it imports nothing, so any simulator module (the shims, ``debpkg``,
``earlyoomsim``, ``nodestate``'s users) can name these without importing the
package that defines the tools (they once formed an import cycle through
``sparkctl_sim.shims``). Standard library only, like the shims that start on
every call.
"""

STATE_ENV = "SPARKCTL_SIM_STATE"  # the node's state file (sparkctl_sim.nodestate)
RUN_DIR_ENV = "SPARKCTL_SIM_RUN_DIR"
UNIT_DIR_ENV = "SPARKCTL_SIM_UNIT_DIR"
SHIMMED_TOOLS_ENV = "SPARKCTL_SIM_SHIMMED_TOOLS"
SERVICE_PASSENV_ENV = "SPARKCTL_SIM_SERVICE_PASSENV"
PREFIX_ENV = "SPARKCTL_SIM_PREFIX"  # the node's root: "/" when namespaced, a directory rootless
