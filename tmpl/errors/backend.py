"""Errors of a generation backend (:class:`BackendError`): routes, weight updates, an HTTP connection."""

from __future__ import annotations

from .base import TmplError


class BackendError(TmplError):
    """A backend failed in a way that affects every request (misconfiguration, missing package).

    ``backend`` names the backend class when the raiser gives it (else None).

    >>> raise BackendError("vllm is not installed: pip install 'tmpl[vllm]'")
    Traceback (most recent call last):
    ...
    tmpl.errors.BackendError: vllm is not installed: pip install 'tmpl[vllm]'
    """

    def __init__(self, *args: object, backend: str | None = None) -> None:
        self.backend = backend
        super().__init__(*args)


class RoutesUnavailableError(BackendError, ValueError):
    """Routes (mixture-of-experts routing replay) were asked of a backend that cannot give them.

    Raised once, when ``Rollout(..., routes=True)`` is built on such a backend: routes are never faked.

    >>> raise RoutesUnavailableError("Scripted gives no routes", backend="Scripted")
    Traceback (most recent call last):
    ...
    tmpl.errors.RoutesUnavailableError: Scripted gives no routes
    """


class RoutesDecodeError(BackendError, ValueError):
    """A routes payload that is not what its engine sends (routing replay): not base64, not ``.npy`` bytes,
    an object array, flat expert IDs that are not a whole number of ``layers x top_k`` rows.

    The backend fails the generation with the message (a malformed answer, like a missing ``token_ids``);
    routes that decode but do not fit the sample end it with ``EndCode.BAD_ROUTES`` instead.

    >>> raise RoutesDecodeError("routed_experts is not base64 of .npy bytes: ...")
    Traceback (most recent call last):
    ...
    tmpl.errors.RoutesDecodeError: routed_experts is not base64 of .npy bytes: ...
    """


class WeightUpdateError(BackendError):
    """A weight update (``Rollout.update_weights``) failed on one engine; ``engine`` names it.

    ``step`` says which step failed (pause, apply, reset_prefix_cache, label, resume).

    >>> raise WeightUpdateError("http://node1:8000", "apply", "HTTP 500 from /collective_rpc")
    Traceback (most recent call last):
    ...
    tmpl.errors.WeightUpdateError: weight update on http://node1:8000 failed at apply: HTTP 500 from /collective_rpc
    """

    def __init__(self, engine: str, step: str, detail: str) -> None:
        self.engine, self.step, self.detail = engine, step, detail
        super().__init__(f"weight update on {engine} failed at {step}: {detail}", backend=engine)


class HTTPConnectionError(BackendError, ConnectionError):
    """A server could not be reached, or dropped the connection before a full response; ``url`` names it.

    Raised by the pooled HTTP client of :class:`tmpl.backends.VLLMServer`, which retries the request
    on another server and marks this one unhealthy for a while.

    >>> raise HTTPConnectionError("http://127.0.0.1:8000", "connection refused")
    Traceback (most recent call last):
    ...
    tmpl.errors.HTTPConnectionError: http://127.0.0.1:8000: connection refused
    """

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"{url}: {reason}", backend="VLLMServer")
