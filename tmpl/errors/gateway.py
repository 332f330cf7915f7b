"""Errors of a request to the gateway (:class:`GatewayError`), each with the HTTP status and error type its API
answers with."""

from __future__ import annotations

from .base import TmplError


class GatewayError(TmplError):
    """A request the gateway (:mod:`tmpl.gateway`, ``tmpl serve``) cannot answer: ``session`` names the
    session, ``status`` is the HTTP status the API answers with, ``kind`` its error type (the OpenAI and
    Anthropic shapes carry it), ``param`` the request field at fault where one is.

    >>> raise GatewayError("s1", 400, "messages[2]: a tool result for call id 'x9' the gateway never issued")
    Traceback (most recent call last):
    ...
    tmpl.errors.GatewayError: session 's1': messages[2]: a tool result for call id 'x9' the gateway never issued
    """

    kind = "invalid_request_error"

    def __init__(self, session: str | None, status: int, reason: str, *, param: str | None = None) -> None:
        self.session = session
        self.status = status
        self.reason = reason
        self.param = param
        where = f"session {session!r}: " if session is not None else ""
        super().__init__(f"{where}{reason}")


class GatewayRequestError(GatewayError, ValueError):
    """A request body the gateway cannot read: malformed JSON, a wrong schema, an unknown tool call id (400).

    >>> GatewayRequestError("s1", "messages: field required", param="messages").status
    400
    """

    def __init__(self, session: str | None, reason: str, *, param: str | None = None, status: int = 400) -> None:
        super().__init__(session, status, reason, param=param)


class SessionNotFoundError(GatewayError, LookupError):
    """A session the gateway does not hold: never opened (strict sessions), expired, or already drained (404).

    >>> SessionNotFoundError("s1", "expired after 600 s idle").status
    404
    """

    kind = "not_found_error"

    def __init__(self, session: str, reason: str) -> None:
        super().__init__(session, 404, reason)


class HistoryConflictError(GatewayError):
    """A history that claims an assistant turn the gateway never produced, refused in strict mode (409).

    >>> HistoryConflictError("s1", "messages[1]: assistant content differs from every reply").status
    409
    """

    kind = "conflict_error"

    def __init__(self, session: str, reason: str) -> None:
        super().__init__(session, 409, reason, param="messages")


class BackendUnavailableError(GatewayError):
    """The backend behind the gateway failed or cannot be reached (503).

    >>> BackendUnavailableError("s1", "connection refused").status
    503
    """

    kind = "api_error"

    def __init__(self, session: str | None, reason: str) -> None:
        super().__init__(session, 503, reason)


class GatewayTimeoutError(GatewayError):
    """The engine gave no reply within the gateway's ``call_timeout``; the engine request was cancelled (504).

    >>> GatewayTimeoutError("s1", "no reply within call_timeout=600 s").status
    504
    """

    kind = "timeout_error"

    def __init__(self, session: str | None, reason: str) -> None:
        super().__init__(session, 504, reason)


class StoreCorruptError(GatewayError):
    """A gateway store (``tmpl serve --store``) that cannot be loaded whole: damaged pages, a truncated
    file, a row failing its checksum, another schema. ``path`` names the file and ``record`` the row
    (its ``seq``) where one is at fault; the gateway refuses to start rather than load part of it.

    >>> raise StoreCorruptError("/data/gw.db", 42, "the 'call' event of session 's1' fails its CRC32")
    Traceback (most recent call last):
    ...
    tmpl.errors.StoreCorruptError: store '/data/gw.db', record 42: the 'call' event of session 's1' fails its CRC32
    """

    kind = "api_error"

    def __init__(self, path: str, record: int | None, reason: str) -> None:
        self.path = path
        self.record = record
        where = f"store {path!r}" + (f", record {record}" if record is not None else "")
        super().__init__(None, 500, f"{where}: {reason}")


class StoreFullError(GatewayError):
    """A call the gateway's store could not keep (the disk is full, ``max_store_bytes`` reached with no
    read episode left to drop, the file unwritable): the call fails (507) and nothing of it is written.

    >>> StoreFullError("/data/gw.db", "over max_store_bytes=1000000").status
    507
    """

    kind = "api_error"

    def __init__(self, path: str, reason: str, session: str | None = None) -> None:
        self.path = path
        super().__init__(session, 507, f"store {path!r}: {reason}")
