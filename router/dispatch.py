"""router -> workers: the queued requests, oldest first, each sent where router/placement.py and (disaggregated)
router/disagg_policy.py say, while some worker can take the oldest."""
from __future__ import annotations

from collections.abc import Awaitable, Callable

from common import protocol as P
from router.admission import WaitQueue
from router.disagg_policy import DisaggPolicy
from router.placement import Placement
from router.registry import WorkerInfo
from router.request import Request

Send = Callable[[WorkerInfo, P.Message], Awaitable[None]]


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
        blocks = place.blocks_needed(ids)
        may_be_local = self.disagg.policy != "always"
        decode = place.decode(blocks, len(ids), req.keys) if may_be_local else place.decode(blocks)
        prefill = place.prefill(len(ids), req.keys)
        if decode is None or (prefill is None and not may_be_local):
            return False
        req.estimate = self.disagg.choose(place.cost(prefill, len(ids), req.keys) if prefill else -1,
                                          place.cost(decode, len(ids), req.keys))
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
