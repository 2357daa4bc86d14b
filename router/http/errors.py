"""Errors as the OpenAI API writes them: a status, and `{"error": {"message", "type", "param", "code"}}`.

A router `error` record becomes one through its code (`from_record`): bad input 400, overload 429, no worker able to
serve 503 (both with `Retry-After`), and so on; 500 is only for the server's own faults.
"""
from __future__ import annotations

import math
import re

from common import protocol as P

# router error code -> (HTTP status, OpenAI error type)
STATUS: dict[str, tuple[int, str]] = {
    P.BAD_REQUEST: (400, "invalid_request_error"),
    P.TOO_LARGE: (400, "invalid_request_error"),
    P.UNKNOWN_TYPE: (400, "invalid_request_error"),
    P.UNSUPPORTED_VERSION: (400, "invalid_request_error"),
    P.UNAUTHORIZED: (401, "authentication_error"),
    P.NOT_FOUND: (404, "not_found_error"),
    P.OVERLOADED: (429, "rate_limit_error"),
    P.UNAVAILABLE: (503, "service_unavailable_error"),
    P.TIMEOUT: (504, "timeout_error"),
    P.ABORTED: (503, "service_unavailable_error"),  # a worker died under it: another attempt may succeed
    P.INTERNAL: (500, "internal_server_error"),
}
_FIELD = re.compile(r"^([A-Za-z_][A-Za-z0-9_.\[\]]*): ")


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str, param: str | None = None, code: str | None = None,
                 retry_after: float | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.retry_after = retry_after
        self.from_router = False  # an `error` record of the router (which counted it in its metrics)

    @classmethod
    def bad_request(cls, problem: str, param: str | None) -> ApiError:
        return cls(400, f"{param}: {problem}" if param else problem, "invalid_request_error", param, P.BAD_REQUEST)

    @classmethod
    def from_record(cls, err: P.Error, fields: dict[str, str] | None = None) -> ApiError:
        """The HTTP error for a router's `error`; `fields` renames the field it names (the router's `token_ids` is a
        completion's `prompt`)."""
        status, type_ = STATUS.get(err.code, (500, "internal_server_error"))
        m = _FIELD.match(err.message) if status == 400 else None  # the router's messages begin with the field
        param = (fields or {}).get(m.group(1), m.group(1)) if m else None
        message = f"{param}: {err.message[m.end():]}" if m else err.message
        e = cls(status, message, type_, param, err.code, err.retry_after)
        e.from_router = True
        return e

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        if self.retry_after is None and self.status not in (429, 503):
            return {}
        return {"Retry-After": str(max(1, math.ceil(self.retry_after or 1)))}  # whole seconds (RFC 9110)
