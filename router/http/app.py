"""The OpenAI-compatible HTTP API (Starlette): `/v1/completions`, `/v1/chat/completions`, `/v1/models`, `/health`,
`/metrics`. A request body becomes the router's `submit` (router/http/schema.py), goes through the router like a ZMQ
client's (router/http/bridge.py), and its replies become OpenAI's JSON or server-sent events (router/http/shapes.py).

A client that goes away (mid-stream or while waiting for a whole completion) aborts its request: every worker frees
what it holds for it.
"""
from __future__ import annotations

import asyncio
import hmac
import time
from typing import Any

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from common import protocol as P
from common.prompt import encode_chat
from common.sampling_params import InvalidRequest
from router.http.bridge import Bridge, Call
from router.http.errors import ApiError
from router.http.schema import ChatRequest, CompletionRequest, decode_body
from router.http.shapes import CHAT, COMPLETION, Shape, sse
from router.router import Router

DEFAULT_MAX_TOKENS = 16  # the completions API's default


class FastJSON(JSONResponse):
    def render(self, content: Any) -> bytes:
        return msgspec.json.encode(content)


class EventStream(StreamingResponse):
    """Server-sent events of one call; whatever ends the response (the last event, the client going away, an error
    writing) closes the call, which aborts it if it still runs."""

    def __init__(self, call: Call, events):
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.call = call

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.call.close()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class FrontEnd:
    def __init__(self, router: Router):
        self.router = router
        self.token = router.auth_token  # with a shared secret, every API call must present it
        self.model = router.config.model_name
        self.created = int(time.time())
        self.bridge = Bridge(router)
        routes = [Route("/v1/completions", self.completions, methods=["POST"]),
                  Route("/v1/chat/completions", self.chat, methods=["POST"]),
                  Route("/v1/models", self.models, methods=["GET"]),
                  Route("/health", self.health, methods=["GET"]),
                  Route("/metrics", self.metrics, methods=["GET"])]
        self.app = Starlette(routes=routes, exception_handlers={
            ApiError: self._api_error, HTTPException: self._http_error, Exception: self._internal_error})

    # ---- endpoints ----------------------------------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        self._authorize(request)
        req: CompletionRequest = decode_body(await request.body(), CompletionRequest)
        self._check_model(req.model)
        prompt = req.prompt_fields()
        submit = P.Submit(request_id=self.bridge.new_id(), stream=req.stream, stop=req.stops(),
                          sampling=req.sampling(DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens),
                          **prompt)
        return await self._run(request, submit, COMPLETION, req, {"token_ids": "prompt"})

    async def chat(self, request: Request) -> Response:
        self._authorize(request)
        req: ChatRequest = decode_body(await request.body(), ChatRequest)
        self._check_model(req.model)
        try:
            ids = encode_chat(self.router.text.tokenizer, req.conversation())
        except InvalidRequest as e:
            raise ApiError.bad_request(e.problem, e.field) from None
        field = "max_tokens" if req.max_completion_tokens is None else "max_completion_tokens"
        max_tokens = req.max_tokens if req.max_completion_tokens is None else req.max_completion_tokens
        if max_tokens is None:  # the chat API's default: as many as the context has room for
            limits = self.router.registry.limits()
            max_tokens = max(1, limits[0] - len(ids)) if limits else DEFAULT_MAX_TOKENS
        submit = P.Submit(request_id=self.bridge.new_id(), token_ids=ids, stream=req.stream, stop=req.stops(),
                          sampling=req.sampling(max_tokens, field))
        return await self._run(request, submit, CHAT, req, {"prompt": "messages", "token_ids": "messages"})

    async def models(self, request: Request) -> Response:
        self._authorize(request)
        limits = self.router.registry.limits()
        card = {"id": self.model, "object": "model", "created": self.created, "owned_by": "pdcluster",
                "root": self.router.config.model, "max_model_len": limits[0] if limits else None}
        return FastJSON({"object": "list", "data": [card]})

    async def health(self, request: Request) -> Response:
        if self.router.registry.can_serve(self.router.config.mode):
            return Response(status_code=200)
        return Response("no workers are ready", status_code=503, headers={"Retry-After": "1"})

    async def metrics(self, request: Request) -> Response:
        self._authorize(request)
        return Response(self.router.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    # ---- one request through the router -------------------------------------------------------------
    async def _run(self, request: Request, submit: P.Submit, shape: Shape, req: Any,
                   fields: dict[str, str]) -> Response:
        """`fields`: the router's names for what this endpoint's body calls otherwise (its errors name the body's)."""
        call = await self.bridge.start(submit)
        refused = call.refused()
        if refused is not None:
            await call.next()
            await call.close()
            raise ApiError.from_record(refused, fields)
        created = int(time.time())
        if submit.stream:
            return EventStream(call, self._events(call, shape, created, req.include_usage, req.return_token_ids))
        waiter = asyncio.ensure_future(self._terminal(call))
        gone = asyncio.ensure_future(_disconnected(request.receive))
        try:
            await asyncio.wait((waiter, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not waiter.done():  # the client went away: abort, and answer no one
                waiter.cancel()
            await call.close()
        if waiter.cancelled():
            return Response(status_code=499)
        msg = waiter.result()
        if isinstance(msg, P.Error):
            raise ApiError.from_record(msg, fields)
        return FastJSON(shape.response(call.request_id, created, self.model, msg, req.return_token_ids))

    @staticmethod
    async def _terminal(call: Call) -> P.Message:
        while True:
            msg = await call.next()
            if call.done:
                return msg

    async def _events(self, call: Call, shape: Shape, created: int, include_usage: bool, return_ids: bool):
        first = True
        while True:
            msg = await call.next()
            if isinstance(msg, P.Delta):
                if msg.text or (return_ids and msg.token_ids):
                    ids = msg.token_ids if return_ids else None
                    yield sse(shape.chunk(call.request_id, created, self.model, msg.text, ids, None, first))
                    first = False
            elif isinstance(msg, P.Result):
                ids = [] if return_ids else None
                yield sse(shape.chunk(call.request_id, created, self.model, "", ids, msg.finish_reason, first))
                if include_usage:
                    yield sse(shape.usage_chunk(call.request_id, created, self.model, msg.usage))
                break
            else:  # an error after the stream began: one error event
                yield sse(ApiError.from_record(msg).body())
                break
        yield b"data: [DONE]\n\n"

    # ---- checks and errors --------------------------------------------------------------------------
    def _authorize(self, request: Request) -> None:
        if self.token is None:
            return
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), self.token.encode()):
            raise ApiError(401, "this server needs the cluster's shared secret as `Authorization: Bearer <key>`",
                           "authentication_error", None, "invalid_api_key")

    def _check_model(self, model: str) -> None:
        if model != self.model:
            raise ApiError(404, f"the model `{model}` does not exist; this server serves `{self.model}`",
                           "not_found_error", "model", "model_not_found")

    async def _api_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        if not exc.from_router:  # refused before reaching the router: counted here
            self.router.metrics.failed(exc.code or P.BAD_REQUEST)
        return FastJSON(exc.body(), status_code=exc.status, headers=exc.headers())

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        err = ApiError(exc.status_code, str(exc.detail), "invalid_request_error", None, None)
        return FastJSON(err.body(), status_code=exc.status_code, headers=exc.headers)

    async def _internal_error(self, request: Request, exc: Exception) -> Response:
        err = ApiError(500, "internal server error", "internal_server_error", None, P.INTERNAL)
        return FastJSON(err.body(), status_code=500)
