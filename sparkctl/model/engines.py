"""What a sparkctl engine process looks like on a node. Pure.

One ERE, used by the stop script the planner renders (``grep -iE`` on the
node) and by the process facts (Python's ``re``), so "is an engine running"
means the same thing everywhere.
"""

from __future__ import annotations

import re

# The name of the engine's container (runtime: docker): launch.sh runs it, the engine unit
# clears a leftover of it before each start, the stop script removes it.
ENGINE_CONTAINER = "sparkctl-engine"

# Engine command lines as the rendered launch scripts start them (docs/engines.md).
# The [x]yz classes keep grep from matching its own command line.
ENGINE_REGEX = ("(^|/| |-m )([d]s41f|[t]ensorfold|[v]llm|[l]lama-server)([ .:]|$)|[s]glang[.]launch_server"
                "|[l]lama_cpp[.]server|[d]ocker run .*sparkctl-engine|/opt/sparkctl/[l]aunch[.]sh")
ENGINE_PATTERN = re.compile(ENGINE_REGEX, re.IGNORECASE)
