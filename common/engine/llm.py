from __future__ import annotations

import itertools
from dataclasses import dataclass

from tqdm import tqdm

from common.config import EngineConfig
from common.engine.llm_engine import LLMEngine
from common.prompt import encode_prompt, load_tokenizer
from common.sampling_params import InvalidRequest, SamplingParams


@dataclass
class RequestOutput:
    index: int
    prompt_token_ids: list[int]
    token_ids: list[int]  # the completion
    text: str
    finish_reason: str
    num_cached_tokens: int


class LLM:
    """Offline generation: `LLM(model_dir).generate(prompts, SamplingParams(...))`."""

    def __init__(self, model: str, **engine_args):
        self._start(EngineConfig(model=model, **engine_args))

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLM:
        llm = cls.__new__(cls)
        llm._start(config)
        return llm

    def _start(self, config: EngineConfig) -> None:
        self.tokenizer = load_tokenizer(config.model)
        self.engine = LLMEngine(config)
        self._ids = itertools.count()

    def generate(self, prompts: str | list[str] | list[list[int]],
                 sampling: SamplingParams | list[SamplingParams] | None = None,
                 chat: bool = False, use_tqdm: bool = True) -> list[RequestOutput]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling if isinstance(sampling, list) else [sampling or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise InvalidRequest("sampling", f"{len(params)} sampling params for {len(prompts)} prompts")
        encoded = [p if isinstance(p, list) else encode_prompt(self.tokenizer, p, chat) for p in prompts]
        for ids, sp in zip(encoded, params):  # all or nothing: validate before queueing any
            self.engine.validate_prompt(ids)
            sp.validate()
        index = {}
        for i, (ids, sp) in enumerate(zip(encoded, params)):
            rid = f"offline-{next(self._ids)}"
            index[rid] = i
            self.engine.add_request(rid, ids, sp)
        results: list[RequestOutput | None] = [None] * len(prompts)
        bar = tqdm(total=len(prompts), desc="Generating", dynamic_ncols=True, disable=not use_tqdm)
        # Throughput of each kind over the steps doing it: steps with prompt tokens count as prefill time.
        prefill_tokens = decode_tokens = 0
        prefill_time = decode_time = 1e-9
        try:
            while self.engine.has_unfinished():
                for seq in self.engine.step():
                    if seq.is_finished:
                        results[index[seq.request_id]] = self._output(index[seq.request_id], seq)
                        bar.update(1)
                step = self.engine.last_step
                prefill_tokens += step.num_prefill_tokens
                decode_tokens += step.num_decode_tokens
                if step.num_prefill_tokens:
                    prefill_time += step.seconds
                else:
                    decode_time += step.seconds
                bar.set_postfix_str(f"prefill {prefill_tokens / prefill_time:.0f} tok/s, "
                                    f"decode {decode_tokens / decode_time:.0f} tok/s", refresh=False)
        except BaseException:
            for rid in index:
                self.engine.abort(rid)
            raise
        finally:
            bar.close()
        return results

    def _output(self, index: int, seq) -> RequestOutput:
        ids = seq.completion_token_ids
        return RequestOutput(index, seq.token_ids[:seq.num_prompt_tokens], ids,
                             self.tokenizer.decode(ids, skip_special_tokens=True), seq.finish_reason,
                             seq.num_cached_tokens)

    def close(self) -> None:
        self.engine.close()
