"""Readiness: does an endpoint serve its model? The one probe, standard library only.

Both sides ask it: the operator (``sparkctl.ops.readiness``: ``up``'s and
``switch``'s ready step through the executor's backend, ``up``'s "is it still
serving" fact, through an SSH forward when serve.bind is fabric) and the head
(``planrun.py``'s HeadBackend in a supervised switch, where this file is pushed
beside the runner). One verdict for one plan, whichever side runs it.

Ready means, in this order (the first that fails is the detail):

* ``/v1/models`` answers 200 and lists the served name. HTTP 401 is "needs a
  key" (no key was sent) or "the key was refused" (one was); any other status
  is named.
* with ``smoke``: a 1-token completion (temperature 0) answers 200 with a
  ``usage`` block whose ``completion_tokens`` is at least 1. No usage block is
  not ready (the engines sparkctl runs all report usage; llama.cpp's server has
  no counter, so usage is its only witness, docs/engines.md), and a
  ``finish_reason`` of ``stop`` does not excuse zero tokens: a sampled
  end-of-sequence token is a generated token (vLLM's usage counts
  ``len(output.token_ids)``, vllm/entrypoints/openai/serving_completion.py), so
  zero is what a wedged engine answers with.
* with a ``metric``: that generated-token counter on ``/metrics`` advanced
  across the completion (the engine counts what it generates, not only answers).

The key is sent as ``Authorization: Bearer``, the check of vLLM's
AuthenticationMiddleware (and SGLang's, llama-server's); it is never in a
returned detail. Proxies from the environment are ignored (the endpoint is a
cluster address). Each request waits at most ``timeout_s``.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from typing import Any

TIMEOUT_S = 5.0  # each request's; a just-loaded engine answers a 1-token completion well within it


def auth_headers(api_key: str | None) -> dict[str, str]:
    """What vLLM's AuthenticationMiddleware (and SGLang's, llama-server's) checks: a Bearer token."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def mask(text: str, key: str | None) -> str:
    """``text`` with the key replaced by ``***`` (an exception's text may quote a header)."""
    return text.replace(key, "***") if key else text


def metric_value(text: str, name: str) -> float | None:
    """The sum of counter ``name``'s samples (every label set) in Prometheus text, None if absent."""
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


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _ask(url: str, headers: dict[str, str], timeout_s: float, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
    """(status, body) of one request; an HTTP error status is an answer, not an exception."""
    data = json.dumps(body).encode() if body is not None else None
    hdrs = {**headers, **({"Content-Type": "application/json"} if data is not None else {})}
    try:
        with _OPENER.open(urllib.request.Request(url, data=data, headers=hdrs), timeout=timeout_s) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


def _counter(url: str, headers: dict[str, str], timeout_s: float, metric: str) -> float | None:
    status, text = _ask(f"{url}/metrics", headers, timeout_s)
    return metric_value(text.decode(errors="replace"), metric) if status == 200 else None


def probe_endpoint(url: str, served_name: str, tokens_metric: str | None, timeout_s: float | None = None,
                   smoke: bool = True, api_key: str | None = None) -> tuple[bool, str]:
    """(ready, detail) of the endpoint at ``url`` (``http://host:port``); see the module's text."""
    auth = auth_headers(api_key)
    timeout_s = TIMEOUT_S if timeout_s is None else timeout_s
    try:
        status, raw = _ask(f"{url}/v1/models", auth, timeout_s)
        if status == 401:
            return False, ("/v1/models: HTTP 401, the key was refused" if api_key
                           else "/v1/models: HTTP 401, the endpoint needs a key (serve.api_key_env)")
        if status != 200:
            return False, f"/v1/models: HTTP {status}"
        models = [m.get("id") for m in json.loads(raw).get("data", [])]
        if served_name not in models:
            return False, f"/v1/models lists {models or 'nothing'}, not {served_name!r}"
        if not smoke:
            return True, "model listed"
        before = _counter(url, auth, timeout_s, tokens_metric) if tokens_metric else None
        status, raw = _ask(f"{url}/v1/completions", auth, timeout_s,
                           {"model": served_name, "prompt": "ping", "max_tokens": 1, "temperature": 0})
        if status != 200:
            text = mask(raw[:120].decode(errors="replace"), api_key)
            return False, f"1-token completion: HTTP {status} {text}".rstrip()
        usage = json.loads(raw).get("usage")
        if not usage:
            return False, "1-token completion carried no usage block"
        if int(usage.get("completion_tokens") or 0) < 1:
            return False, "1-token completion returned no tokens (a wedged engine answers 200 with nothing)"
        if tokens_metric:
            after = _counter(url, auth, timeout_s, tokens_metric)
            if after is None or before is None or after <= before:
                return False, f"generated-token counter {tokens_metric} did not advance"
        return True, "serving"
    except (OSError, http.client.HTTPException, ValueError, KeyError, AttributeError, TypeError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        detail = mask(str(reason), api_key)[:120]
        return False, f"{type(exc).__name__}: {detail or 'no answer'}"
