"""Python client for a pdcluster router: `Client` (blocking) and `AsyncClient` (asyncio), thin wrappers that run
the flows of one client core without I/O (`core.py`). Both speak the wire protocol of docs/protocol.md over one
ZMQ DEALER socket and validate every frame with `common.protocol`; docs/client.md is the user guide."""
from common.protocol import Delta, Stats, Timings, Usage
from router.client.aio import AsyncClient, AsyncStream
from router.client.core import RETRYABLE
from router.client.submit import SAMPLING_FIELDS, build_submit
from router.client.results import ClientError, ClientTimeout, Completion, ServerError, readiness_problem
from router.client.sync import Client, Stream

__all__ = [
    "Client", "AsyncClient", "Stream", "AsyncStream", "Completion", "ClientError", "ServerError",
    "ClientTimeout", "readiness_problem", "build_submit",
    "SAMPLING_FIELDS", "RETRYABLE", "Usage", "Timings", "Delta", "Stats",
]
