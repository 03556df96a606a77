"""Where `sparkctl bench PROFILE` meets the cluster: endpoint, configuration, telemetry.

Owns: turning a resolved profile and the inventory into what the runner
needs: the head's endpoint URL, the served model name, the configuration dict
recorded in every results row, and the telemetry hook. The runner itself
never sees a profile, an inventory or a transport.

Must not: print, or change any host. The cluster check (probes, laws) is not
done here: the caller passes it in as ``check_fn``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sparkctl.bench.telemetry import Telemetry

CheckFn = Callable[[Any, Any, bool], Mapping[str, Any]]
"""``check_fn(resolved, inventory, force) -> facts``: probe the nodes, judge the laws,
raise :class:`~sparkctl.errors.CheckFailed` when a law fails and ``force`` is
false; return facts to record in every row (``kernel``, ``page_size_kib``,
``clock_cap_mhz`` as measured, ``waivers``, ``check_ok``, ...)."""


def config_from_profile(resolved: Any) -> dict[str, Any]:
    """The configuration a profile alone can tell (no cluster needed)."""
    p = resolved.profile
    return {
        "profile": resolved.name,
        "profile_digest": resolved.digest(),
        "profile_files": list(resolved.files),
        "engine": p.engine.name,
        "engine_version": p.engine.version,
        "model": p.model.id,
        "served_name": p.model.served_name,
        "weights_format": p.model.weights_format,
        "context_len_tokens": p.model.context_len_tokens,
        "topology": p.topology.layout,
        "tp_size": p.topology.tp_size,
        "replicas": p.topology.replicas,
        "clock_cap_mhz": p.laws.clock_cap_mhz,
        "page_size_kib": p.laws.page_size_kib,   # what the profile asks for; check_fn records what runs
        "kernel": None,
        "waivers": [],
        "bench": p.bench.model_dump(mode="json"),
        "thinking": p.thinking.model_dump(mode="json"),
        # the NAME of the operator's variable holding the endpoint's key; never the key
        "api_key_env": p.serve.api_key_env,
    }


def prepare(ctx_obj: Any, profile: str, force: bool, check_fn: CheckFn | None = None, endpoint: str | None = None
            ) -> tuple[str, str, dict[str, Any], Telemetry | None]:
    """``(base_url, model, config, telemetry)`` for benchmarking PROFILE on the inventory's cluster.

    ``ctx_obj`` is the CLI's context object (``resolve(name)``, ``inventory()``).
    The endpoint is the head node of the first replica (``http://HOST:serve.port``,
    HOST = the inventory's ssh/management address, or the head's fabric address with
    serve.bind: fabric, when ``config["endpoint"]["via"]`` names the head to forward
    through); the model is
    ``model.served_name``. ``telemetry`` is None until a transport-backed
    sampler is wired in.

    ``endpoint``: ``gateway`` benches through the gateway (serve.gateway: the cluster's one
    endpoint, its node and port, bound like the engines), ``replica`` the first replica's head
    directly; None = the gateway when serve.gateway is enabled. ``config["endpoint"]["through"]``
    records which (run.json).
    """
    from sparkctl.model.layout import bind

    res = ctx_obj.resolve(profile)
    inv = ctx_obj.inventory()
    layout = bind(res, inv)
    head = inv.node(layout.heads()[0].node)
    p = res.profile
    from sparkctl.model.record import operator_route
    from sparkctl.plan.render import bind_host

    # serve.bind: where the head's engine listens; "via" when only the head reaches it (its
    # fabric address): the caller opens an SSH forward through the head and benches that.
    h0 = layout.heads()[0]
    route = operator_route(head.name, head.host, bind_host(res.for_node(head.name), h0, head.host), p.serve.port)
    through = endpoint or ("gateway" if p.serve.gateway.enabled else "replica")
    if through == "gateway":
        if not p.serve.gateway.enabled:
            from sparkctl.errors import ConfigError, Ref

            raise ConfigError(f"{profile} runs no gateway", Ref(key="serve.gateway.enabled"),
                              hint="--endpoint replica, or set serve.gateway.enabled")
        from sparkctl.plan import gatewayplan

        gw = gatewayplan.gateway_node(res, inv)
        route = operator_route(gw, inv.node(gw).host, gatewayplan.listen_address(res, inv, gw), p.serve.gateway.port)
    base_url = route.url
    config = config_from_profile(res)
    config["endpoint"] = {"url": route.url, "via": route.via, "through": through}
    config["inventory"] = inv.file
    config["nodes"] = list(layout.nodes)
    config["head"] = head.name
    # The head's rendered command line: the runner reads llama-server's per-slot window
    # from it when the server has no /props (workloads.llama_server_slot_ctx).
    from sparkctl.model.paths import under
    from sparkctl.plan.render import engine_argv

    r0 = layout.ranks[0]
    hp = res.for_node(r0.node)
    config["engine_argv"] = engine_argv(hp, r0, under(inv.node(r0.node).prefix, hp.model.weights_path))
    # The lead wires the cluster check here: check_fn probes every node and judges the laws
    # (refusing to bench a failing cluster unless force), and its facts overwrite the
    # profile's declared values with what the nodes really run.
    if check_fn is not None:
        config.update(dict(check_fn(res, inv, force)))
    config["forced"] = bool(force)
    return base_url, p.model.served_name, config, None
