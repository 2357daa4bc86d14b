"""The host's own work in a step, no device needed: what a saturated engine does on the CPU between two steps.

Under overlapped scheduling the host builds step N+1 while the GPU runs step N; where that takes longer than N, the
GPU waits. At a prefill-heavy load past capacity (docs/benchmarks.md, "Stop 54") a step carries several prompts
beside a batch of decodes. Timed here, each the least of `--repeat` rounds, ms:
- `pack`: `step_inputs.pack_step` of such a step (decodes, then prompts), and of its decodes alone;
- `allocate` / `commit`: the block manager taking the prompts' blocks (no prefix hit, then every block a hit) and
  registering them in the prefix cache once computed.

    python -m scripts.bench_host [--decodes 60] [--prompts 5] [--prompt-len 1626] [--context 1400]
"""
from __future__ import annotations

import argparse
import random
import time
import timeit
from collections.abc import Callable

from common.engine.block_manager import BlockManager
from common.engine.scheduler import ScheduledBatch
from common.engine.sequence import Sequence
from common.engine.step_inputs import pack_step
from common.sampling_params import SamplingParams

BLOCK_SIZE = 16
VOCAB = 150_000


def best_ms(fn: Callable[[], object], number: int, repeat: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e3


def sequence(rid: str, rng: random.Random, tokens: int, computed: int, first_block: int) -> Sequence:
    seq = Sequence(rid, [rng.randrange(VOCAB) for _ in range(tokens)], SamplingParams())
    seq.block_table = list(range(first_block, first_block + -(-(tokens + 256) // BLOCK_SIZE)))
    seq.num_computed_tokens = computed
    return seq


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--decodes", type=int, default=60, help="decoding sequences in the step")
    ap.add_argument("--context", type=int, default=1400, help="tokens of each decoding sequence")
    ap.add_argument("--prompts", type=int, default=5, help="prompts in the step")
    ap.add_argument("--prompt-len", type=int, default=1626, help="tokens of each prompt")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    rng = random.Random(0)
    stride = -(-(max(args.context, args.prompt_len) + 256) // BLOCK_SIZE)
    decodes = [sequence(f"d{i}", rng, args.context, args.context - 1, i * stride) for i in range(args.decodes)]
    prompts = [sequence(f"p{i}", rng, args.prompt_len, 0, (args.decodes + i) * stride) for i in range(args.prompts)]
    mixed = ScheduledBatch(decodes + prompts, [1] * len(decodes) + [args.prompt_len] * len(prompts))
    alone = ScheduledBatch(decodes, [1] * len(decodes))
    print(f"a step of {args.decodes} decodes ({args.context} tokens each) and {args.prompts} prompts of "
          f"{args.prompt_len} tokens, blocks of {BLOCK_SIZE}; ms, the least of {args.repeat} rounds")
    for name, batch in (("the whole step", mixed), ("its decodes alone", alone)):
        if batch.seqs:
            ms = best_ms(lambda: pack_step(batch, BLOCK_SIZE, 0, lambda *_: None), 20, args.repeat)
            print(f"pack, {name}: {ms:.3f}")

    def blocks() -> tuple[float, float, float]:
        manager = BlockManager(args.prompts * stride * 2 + 16, BLOCK_SIZE)
        fresh = [Sequence(p.request_id, p.token_ids, SamplingParams()) for p in prompts]
        again = [Sequence(p.request_id + "'", p.token_ids, SamplingParams()) for p in prompts]
        t0 = time.perf_counter()
        for seq in fresh:
            manager.allocate(seq, seq.num_tokens)
        t1 = time.perf_counter()
        for seq in fresh:
            seq.num_computed_tokens = seq.num_tokens
            manager.commit(seq, 0)
        t2 = time.perf_counter()
        for seq in again:
            manager.allocate(seq, seq.num_tokens)
        return t1 - t0, t2 - t1, time.perf_counter() - t2
    miss, commit, hit = (min(t) * 1e3 for t in zip(*(blocks() for _ in range(args.repeat))))
    print(f"allocate, no prefix hit: {miss:.3f}")
    print(f"commit: {commit:.3f}")
    print(f"allocate, every block a hit: {hit:.3f}")


if __name__ == "__main__":
    main()
