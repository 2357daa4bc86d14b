"""A client's request as the router takes it: the typed `submit` record built from a call's arguments, each checked
where it is given (a bad one raises InvalidRequest naming it, before anything is sent)."""
from __future__ import annotations

import uuid
from typing import Any, Union

from common.protocol import ProtocolError, Submit, checked
from common.sampling_params import InvalidRequest, SamplingParams

Prompt = Union[str, list[int]]
SAMPLING_FIELDS = SamplingParams.field_names()


def build_submit(prompt: Prompt, *, chat: bool, stream: bool, request_id: str | None,
                 sampling: dict[str, Any]) -> Submit:
    """A validated Submit; a bad argument raises InvalidRequest (a ValueError) naming it. Besides the sampling
    fields, `sampling` may hold `stop` (a string or a list of them, matched by the router on the text) and `migrate`
    (Submit.migrate: False opts a stream out of migration)."""
    sampling = dict(sampling)
    stop = sampling.pop("stop", None)
    stop = [stop] if isinstance(stop, str) else list(stop or [])
    migrate = sampling.pop("migrate", True)
    if not isinstance(migrate, bool):
        raise InvalidRequest("migrate", f"must be a boolean, got {migrate!r}")
    unknown = sorted(set(sampling) - set(SAMPLING_FIELDS))
    if unknown:
        raise TypeError(f"unknown sampling argument {unknown[0]!r}; expected some of {', '.join(SAMPLING_FIELDS)}")
    params = SamplingParams(**sampling)  # raises InvalidRequest naming the field
    if isinstance(prompt, str):
        text, ids = prompt, None
    elif isinstance(prompt, (list, tuple)):
        text, ids = None, list(prompt)
    else:
        raise InvalidRequest("prompt", f"expected a string or a list of token ids, got {type(prompt).__name__}")
    try:
        return checked(Submit(request_id=request_id if request_id is not None else uuid.uuid4().hex, prompt=text,
                              token_ids=ids, chat=chat, sampling=params, stream=stream, stop=stop,
                              migrate=migrate))
    except ProtocolError as exc:
        field_name, _, problem = exc.message.partition(": ")
        raise InvalidRequest(field_name, problem) from None
