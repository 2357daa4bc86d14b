"""The two response shapes of the OpenAI API, built from the router's records: completions (`text_completion`) and
chat (`chat.completion`), whole or as stream chunks, and the server-sent event that carries a chunk."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from common import protocol as P


def sse(obj: Any) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


def usage(u: P.Usage) -> dict[str, Any]:
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


@dataclass(frozen=True)
class Shape:
    chat: bool
    prefix: str  # of response ids
    obj: str  # `object` of a whole response
    chunk_obj: str  # `object` of a stream chunk

    def response(self, rid: str, created: int, model: str, result: P.Result, return_ids: bool) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": result.text}, "logprobs": None,
                      "finish_reason": result.finish_reason}
        else:
            choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": result.finish_reason}
        if return_ids:
            choice["token_ids"] = result.token_ids
        return {"id": self.prefix + rid, "object": self.obj, "created": created, "model": model,
                "choices": [choice], "usage": usage(result.usage)}

    def chunk(self, rid: str, created: int, model: str, text: str, token_ids: list[int] | None,
              finish_reason: str | None, first: bool) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text or first:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        if token_ids is not None:
            choice["token_ids"] = token_ids
        return {"id": self.prefix + rid, "object": self.chunk_obj, "created": created, "model": model,
                "choices": [choice]}

    def usage_chunk(self, rid: str, created: int, model: str, u: P.Usage) -> dict[str, Any]:
        """The last chunk with `stream_options.include_usage`: no choices, the request's usage."""
        return {"id": self.prefix + rid, "object": self.chunk_obj, "created": created, "model": model,
                "choices": [], "usage": usage(u)}


COMPLETION = Shape(chat=False, prefix="cmpl-", obj="text_completion", chunk_obj="text_completion")
CHAT = Shape(chat=True, prefix="chatcmpl-", obj="chat.completion", chunk_obj="chat.completion.chunk")
