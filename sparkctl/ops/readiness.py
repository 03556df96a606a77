"""Readiness: does an endpoint serve its model? The probe the executor's ready steps call.

Runs on the operator's side with httpx; ``sparkctl/remote/planrun.py`` carries the
same probe in the standard library for the head.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import httpx


def api_key_from_env(spec: Mapping[str, str]) -> str | None:
    """The endpoint's key from the operator's environment (the ready step names the variable, never the key)."""
    return os.environ.get(spec.get("env", "")) or None


def auth_headers(api_key: str | None) -> dict[str, str]:
    """What vLLM's AuthenticationMiddleware (and SGLang's, llama-server's) checks: a Bearer token."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}

def metric_value(text: str, name: str) -> float | None:
    total = None
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            rest = line[len(name):]
            if rest[:1] in (" ", "{"):
                try:
                    total = (total or 0.0) + float(line.rsplit(None, 1)[-1])
                except ValueError:
                    pass
    return total


def probe_endpoint(url: str, served_name: str, tokens_metric: str | None, timeout_s: float = 5.0,
                   smoke: bool = True, api_key: str | None = None) -> tuple[bool, str]:
    """One readiness probe: /v1/models lists the name, a 1-token completion, the counter advances.

    ``api_key``: sent as ``Authorization: Bearer``; never in a returned detail."""
    try:
        with httpx.Client(timeout=timeout_s, trust_env=False, headers=auth_headers(api_key)) as c:
            models = [m.get("id") for m in c.get(f"{url}/v1/models").json().get("data", [])]
            if served_name not in models:
                return False, f"/v1/models lists {models or 'nothing'}, not {served_name!r}"
            if not smoke:
                return True, "model listed"
            before = metric_value(c.get(f"{url}/metrics").text, tokens_metric) if tokens_metric else None
            r = c.post(f"{url}/v1/completions", json={"model": served_name, "prompt": "ping", "max_tokens": 1,
                                                      "temperature": 0})
            if r.status_code != 200:
                return False, f"1-token completion: HTTP {r.status_code} {r.text[:120]}"
            body = r.json()
            usage = body.get("usage")
            finish = ((body.get("choices") or [{}])[0] or {}).get("finish_reason")
            if not usage:
                return False, "1-token completion carried no usage block"
            if int(usage.get("completion_tokens", 0)) < 1 and finish != "stop":
                return False, "1-token completion returned no tokens (a wedged engine answers 200 with nothing)"
            if tokens_metric:
                after = metric_value(c.get(f"{url}/metrics").text, tokens_metric)
                if after is None or before is None or after <= before:
                    return False, f"generated-token counter {tokens_metric} did not advance"
            return True, "serving"
    except (httpx.HTTPError, ValueError, KeyError, AttributeError) as exc:
        detail = str(exc)[:120].replace(api_key, "***") if api_key else str(exc)[:120]
        return False, f"{type(exc).__name__}: {detail or 'no answer'}"


