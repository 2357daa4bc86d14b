"""Error codes (a closed set; docs/protocol.md says what each means to a client) and the exception that carries one."""
from __future__ import annotations

BAD_REQUEST = "bad_request"
UNSUPPORTED_VERSION = "unsupported_version"
UNKNOWN_TYPE = "unknown_type"
TOO_LARGE = "too_large"
NOT_FOUND = "not_found"
OVERLOADED = "overloaded"
UNAVAILABLE = "unavailable"
TIMEOUT = "timeout"
ABORTED = "aborted"
UNAUTHORIZED = "unauthorized"
INTERNAL = "internal"
ERROR_CODES = (
    BAD_REQUEST, UNSUPPORTED_VERSION, UNKNOWN_TYPE, TOO_LARGE, NOT_FOUND, OVERLOADED,
    UNAVAILABLE, TIMEOUT, ABORTED, UNAUTHORIZED, INTERNAL,
)


class ProtocolError(Exception):
    """A frame or message that breaks the protocol. `request_id` is "" when it could not be recovered."""

    def __init__(self, code: str, message: str, request_id: str = "") -> None:
        if code not in ERROR_CODES:
            raise ValueError(f"unknown error code {code!r}")
        # args are the constructor's arguments so the exception survives Ray's serialization.
        super().__init__(code, message, request_id)
        self.code = code
        self.message = message
        self.request_id = request_id

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"
