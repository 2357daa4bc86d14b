"""The OpenAI request bodies, validated at the boundary: msgspec structs decoded from the JSON body, then turned into
the router's own `submit` record. Every refusal is an `ApiError` naming the field (`param`).

Fields the API has and pdcluster does not support (`n` other than 1, `logprobs`, tools, penalties, ...) are refused
with a 400 that says so, never ignored; fields neither knows are ignored (clients send their own extras).
"""
from __future__ import annotations

import re
from typing import Any

import msgspec

from common import protocol as P
from common.sampling_params import InvalidRequest
from router.http.errors import ApiError

_AT = re.compile(r"^(?P<problem>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_MISSING = re.compile(r"^Object missing required field `([^`]*)`")


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class ContentPart(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None


class _Common(msgspec.Struct, kw_only=True):
    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # extras, as vLLM names them
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    return_token_ids: bool = False  # each choice (and streamed chunk) carries its token ids
    # the API's, not supported here: refused unless at their no-op value
    n: int | None = None
    logprobs: Any = None
    top_logprobs: Any = None
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: Any = None
    response_format: Any = None

    def unsupported(self) -> list[str]:
        """The fields given at a value this server cannot honour."""
        bad = []
        if self.n not in (None, 1):
            bad.append("n")
        for name in ("logprobs", "top_logprobs"):
            if getattr(self, name) not in (None, False):
                bad.append(name)
        for name in ("tools", "functions", "function_call", "logit_bias"):
            if getattr(self, name):
                bad.append(name)
        if self.tool_choice not in (None, "none"):
            bad.append("tool_choice")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                bad.append(name)
        if self.response_format is not None and self.response_format != {"type": "text"}:
            bad.append("response_format")
        return bad

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > P.MAX_STOP_STRINGS or not all(0 < len(s) <= 256 for s in stops):
            raise ApiError.bad_request(f"at most {P.MAX_STOP_STRINGS} strings of 1 to 256 characters", "stop")
        return stops

    def sampling(self, max_tokens: int, max_tokens_field: str = "max_tokens") -> P.Sampling:
        given = {name: getattr(self, name) for name in ("temperature", "top_p", "top_k", "seed")
                 if getattr(self, name) is not None}
        try:
            return P.Sampling(max_tokens=max_tokens, stop_token_ids=self.stop_token_ids or [],
                              ignore_eos=self.ignore_eos, **given)
        except InvalidRequest as e:
            raise ApiError.bad_request(e.problem, max_tokens_field if e.field == "max_tokens" else e.field) from None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Common, kw_only=True):
    prompt: Any = None  # a string or token ids (or a batch of one of them)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    def unsupported(self) -> list[str]:
        bad = super().unsupported()
        if self.echo:
            bad.append("echo")
        if self.best_of not in (None, 1):
            bad.append("best_of")
        if self.suffix:
            bad.append("suffix")
        return bad

    def prompt_fields(self) -> dict[str, Any]:
        """`prompt` or `token_ids` of the submit."""
        prompt = self.prompt
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            return {"prompt": prompt}
        if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            return {"token_ids": prompt}
        if isinstance(prompt, list) and prompt and all(isinstance(t, (str, list)) for t in prompt):
            raise ApiError.bad_request("batches of prompts are not supported: send one request per prompt", "prompt")
        raise ApiError.bad_request("must be a string or a non-empty list of token ids", "prompt")


class ChatRequest(_Common, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None

    def conversation(self) -> list[dict[str, str]]:
        """The messages as the chat template takes them (text only)."""
        if not self.messages:
            raise ApiError.bad_request("must hold at least one message", "messages")
        out = []
        for i, m in enumerate(self.messages):
            if m.role not in ("system", "developer", "user", "assistant"):
                raise ApiError.bad_request(f"role {m.role!r} is not supported (system, developer, user, assistant)",
                                           f"messages[{i}].role")
            content = m.content
            if isinstance(content, list):
                if not all(part.type == "text" and part.text is not None for part in content):
                    raise ApiError.bad_request("only text parts are supported", f"messages[{i}].content")
                content = "".join(part.text for part in content)
            out.append({"role": "system" if m.role == "developer" else m.role, "content": content or ""})
        return out


def decode_body(body: bytes, kind: type[msgspec.Struct]) -> Any:
    """The body as `kind`, or ApiError 400 naming the field that does not fit."""
    try:
        req = msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as e:
        m = _AT.match(str(e))
        problem, path = m.group("problem"), (m.group("path") or "").lstrip(".")
        missing = _MISSING.match(problem)
        if missing:  # name the missing field itself
            path = f"{path}.{missing.group(1)}" if path else missing.group(1)
        raise ApiError.bad_request(problem, path or None) from None
    except msgspec.DecodeError as e:
        raise ApiError.bad_request(f"the body is not valid JSON: {e}", None) from None
    bad = req.unsupported()
    if bad:
        raise ApiError.bad_request("is not supported by this server", bad[0])
    return req
