"""router -> workers: the queued requests, oldest first, each sent where router/placement.py and (disaggregated)
router/disagg_policy.py say, while some worker can take the oldest."""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from common import protocol as P
from router.admission import WaitQueue
from router.disagg_policy import DisaggPolicy, Estimate, LocalWork
from router.placement import Placement
from router.prefix_index import PromptKeys
from router.registry import WorkerInfo
from router.request import Request

Send = Callable[[WorkerInfo, P.Message], Awaitable[None]]


@dataclass
class DisaggChoice:
    """Where a disaggregated prompt goes: its decode worker (holding `blocks` for it), the prefill worker that
    would compute its KV (None: none could), and whether it is prefilled on the decode worker (`estimate.local`)."""

    decode: WorkerInfo
    prefill: WorkerInfo | None
    blocks: int
    estimate: Estimate


def choose_disagg(place: Placement, disagg: DisaggPolicy, ids: list[int],
                  keys: PromptKeys | None) -> DisaggChoice | None:
    """The choice itself, without sending anything (the planner's simulator makes the same one); None: no worker can
    take the prompt now."""
    blocks = place.blocks_needed(ids)
    may_be_local = disagg.policy != "always"
    decode = place.decode(blocks, len(ids), keys) if may_be_local else place.decode(blocks)
    prefill = place.prefill(len(ids), keys)
    if decode is None or (prefill is None and not may_be_local):
        return None
    own = len(ids) - place.cached_tokens(decode, keys)
    local = LocalWork(decode.worker_id, place.cost(decode, len(ids), keys), own, len(decode.assigned))
    estimate = disagg.choose(place.cost(prefill, len(ids), keys) if prefill else -1, local)
    return DisaggChoice(decode, prefill, blocks, estimate)


class Dispatcher:
    def __init__(self, mode: str, placement: Placement, disagg: DisaggPolicy, send: Send):
        self.mode, self.placement, self.disagg, self.send = mode, placement, disagg, send

    async def run(self, queue: WaitQueue) -> None:
        while queue:
            req = queue.peek()
            ids = req.attempt_ids
            if req.keys is None:
                req.keys = self.placement.keys(ids)
            if not await (self._colocated(req, ids) if self.mode == "colocated" else self._disagg(req, ids)):
                return
            queue.pop()

    async def _colocated(self, req: Request, ids: list[int]) -> bool:
        worker = self.placement.colocated(len(ids), req.keys)
        if worker is None:
            return False
        req.run_on(worker, self.placement.cached_tokens(worker, req.keys))
        self.placement.placed(worker, req.keys)
        await self.send(worker, P.GenerateTask(request_id=req.rid, token_ids=ids, sampling=req.attempt_sampling))
        return True

    async def _disagg(self, req: Request, ids: list[int]) -> bool:
        """A decode worker for it, and where it is prefilled: a prefill worker, the KV handed over (the decode worker
        first reserves its blocks: `reserve`, then router.py's `on_reserved`), or the decode worker itself."""
        place = self.placement
        choice = choose_disagg(place, self.disagg, ids, req.keys)
        if choice is None:
            return False
        decode, prefill, blocks, req.estimate = choice.decode, choice.prefill, choice.blocks, choice.estimate
        place.placed(decode, req.keys)  # either way the decode worker's cache gets the prompt's blocks
        if req.estimate.local:
            req.run_on(decode, place.cached_tokens(decode, req.keys), blocks)
            await self.send(decode, P.GenerateTask(request_id=req.rid, token_ids=ids, sampling=req.attempt_sampling))
        else:
            req.pair(prefill, decode, blocks, place.cached_tokens(prefill, req.keys))
            place.placed(prefill, req.keys)  # at once: the next request with this prefix follows it there
            await self.send(decode, P.Reserve(request_id=req.rid, token_ids=ids, sampling=req.attempt_sampling,
                                              prefill_worker_id=prefill.worker_id))
        return True
