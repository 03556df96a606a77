"""``python3 -m sparkctl_sim.shims TOOL ARGS...``: see :func:`sparkctl_sim.shims.dispatch.main`."""

from sparkctl_sim.shims.dispatch import main

raise SystemExit(main())
