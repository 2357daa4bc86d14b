from __future__ import annotations

import gc
import logging
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from common.engine.attention.backend import select_backend
from common.engine.attention.decode_plan import PLAN_ROWS, DecodePlan, plan_table
from common.engine.attention.metadata import AttentionMetadata
from common.config import EngineConfig
from common.engine.context import forward_context
from common.engine.cuda_graph import DecodeGraphs
from common.engine.device import torch_dtype
from common.engine.in_flight import InFlight
from common.engine.kv_pool import KVLayout, KVPool
from common.engine.layers.sampler import SamplingBatch, sample
from common.engine.loader import init_dummy_weights, load_weights
from common.engine.models.llama import CausalLM
from common.engine.scheduler import ScheduledBatch
from common.engine.sequence import PENDING, Sequence

log = logging.getLogger(__name__)

# cmd, T, B, block-table width, num_decodes, max_query_len, max_seq_len, prefix_cached, max_prefill_q, plan units
_HEADER = 10
_RUN, _STOP = 1, 0


@dataclass
class StepInputs:
    """A step's model inputs on the device: what every tensor-parallel rank runs the forward on."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    logits_indices: torch.Tensor  # [B] int64: the last new token of each sequence
    attn: AttentionMetadata


class ModelRunner:
    """Owns the model, its KV pool and the device; turns a scheduled batch into sampled tokens.

    Rank 0 builds each step's inputs and broadcasts them, as one int64 tensor, to the other
    tensor-parallel ranks, which run the same forward (`serve_forever`).
    """

    def __init__(self, config: EngineConfig, rank: int = 0, init_method: str | None = None):
        self.config = config
        self.rank, self.world = rank, config.tensor_parallel_size
        mc = config.model_config
        if config.device == "cuda":
            self.device = torch.device("cuda", rank)
            torch.cuda.set_device(self.device)
            self._memory_at_start = torch.cuda.memory_allocated(self.device)
        else:
            self.device = torch.device("cpu")
        if self.world > 1:
            dist.init_process_group("nccl" if config.device == "cuda" else "gloo", init_method=init_method,
                                    world_size=self.world, rank=rank)
        self.dtype = torch_dtype(config)
        torch.manual_seed(config.seed)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device(self.device):
                self.model = CausalLM(mc)
        finally:
            torch.set_default_dtype(previous)
        if config.load_format == "dummy":
            init_dummy_weights(self.model, config.seed)
        else:
            load_weights(self.model, config.model, show_progress=rank == 0)
        self.backend = select_backend(config.attention_backend, config.device)
        attn_layers = self.model.attention_layers()
        for layer in attn_layers:
            layer.backend = self.backend
        self.graphs: DecodeGraphs | None = None
        self._launches = 0
        self._last_tokens: torch.Tensor | None = None
        self._copy_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.layout = KVLayout(mc.num_layers, config.block_size, attn_layers[0].num_kv_heads, mc.head_dim, self.dtype)
        self.kv_pool = KVPool(self.layout, self._num_kv_blocks(), self.device)
        for i, layer in enumerate(attn_layers):
            layer.k_cache, layer.v_cache = self.kv_pool.k_cache(i), self.kv_pool.v_cache(i)
        if config.device == "cuda" and not config.enforce_eager and self.backend.name != "torch":
            max_len = min(config.max_model_len, self.num_blocks * config.block_size)
            self.graphs = DecodeGraphs(self.model, config.max_num_seqs, max_len, config.block_size,
                                       mc.hidden_size, self.layout.num_kv_heads, self.dtype, self.device)
            self.graphs.capture()

    @property
    def num_blocks(self) -> int:
        return self.kv_pool.num_blocks

    # ---- sizing -------------------------------------------------------------------------------------
    def _num_kv_blocks(self) -> int:
        cfg = self.config
        if cfg.num_kv_blocks:
            n = cfg.num_kv_blocks
        elif cfg.device == "cpu":
            n = cfg.kv_cache_memory // self.layout.block_bytes
        else:
            n = self._num_kv_blocks_from_gpu_memory()
        if self.world > 1:  # every rank must hold the same blocks: take the smallest
            t = torch.tensor([n], device=self.device)
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
            n = int(t.item())
        if n < 1:
            raise RuntimeError("no memory is left for the KV cache: raise --gpu-memory-utilization / "
                               "--kv-cache-memory, or lower --max-num-batched-tokens")
        log.info("KV pool: %d blocks of %d tokens (%.2f GiB)", n, cfg.block_size, n * self.layout.block_bytes / 2**30)
        return n

    @torch.inference_mode()
    def _num_kv_blocks_from_gpu_memory(self) -> int:
        """Run the largest prefill once, without a cache, to learn the activation peak; the rest of this
        worker's share (`gpu_memory_utilization` of the card) becomes KV blocks."""
        cfg = self.config
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        num_tokens = min(cfg.max_num_batched_tokens, cfg.max_model_len * cfg.max_num_seqs)
        seq_len = min(cfg.max_model_len, num_tokens)
        lens = [seq_len] * (num_tokens // seq_len) + ([num_tokens % seq_len] if num_tokens % seq_len else [])
        self.execute(self._warmup_inputs(lens))
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        peak = torch.cuda.max_memory_allocated()
        # Only this runner's own use counts against its share: other engines may live in this process.
        budget = min(total * cfg.gpu_memory_utilization - (peak - self._memory_at_start), free * 0.98)
        return int(budget // self.layout.block_bytes)

    def _warmup_inputs(self, lens: list[int]) -> StepInputs:
        qsl = np.concatenate([[0], np.cumsum(lens)])
        positions = np.concatenate([np.arange(n) for n in lens])
        payload = (np.zeros(qsl[-1], np.int64), positions, np.full(qsl[-1], -1), qsl, np.asarray(lens),
                   np.zeros((len(lens), 0), np.int64), qsl[1:] - 1)
        header = [_RUN, int(qsl[-1]), len(lens), 0, 0, max(lens), max(lens), 0, max(lens), 0]
        return self._unpack(torch.tensor(header), torch.from_numpy(np.concatenate([np.ravel(p) for p in payload])).to(self.device))

    # ---- one step -----------------------------------------------------------------------------------
    @torch.inference_mode()
    def launch(self, batch: ScheduledBatch) -> InFlight:
        """Queues the step's forward and sampling on the GPU and returns without waiting for them.

        Inputs go up on a copy stream; a PENDING input token (sampled by the previous launch, not yet seen
        by the CPU) is gathered from that launch's tokens on the device. The sampled tokens come back
        through pinned memory and an event: no device-wide sync.
        """
        header, payload, pending = self._pack(batch)
        payload = self._upload(payload)
        if pending is not None:
            dst, src = self._upload(pending).unbind(0)
            payload[dst] = self._last_tokens[src]
        if self.world > 1:
            dist.broadcast(header.to(self.device), 0)
            dist.broadcast(payload, 0)
        started = InFlight.mark() if self.device.type == "cuda" else None
        logits = self.execute(self._unpack(header, payload))
        tokens = sample(logits, self._sampling_batch(batch.seqs))
        self._launches += 1
        self._last_tokens = tokens
        for row, seq in enumerate(batch.seqs):
            seq.sample_ref = (self._launches, row)
        return InFlight.start(tokens, started)

    def run(self, batch: ScheduledBatch) -> list[int]:
        """One step, waiting for its tokens."""
        return self.launch(batch).tokens()

    def _upload(self, host: torch.Tensor) -> torch.Tensor:
        """Host -> device without waiting: pinned (a pageable copy would wait for all queued GPU work), on the
        copy stream, ordered before the compute stream's next use."""
        if self.device.type != "cuda":
            return host
        host = host.pin_memory()
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self._copy_stream):
            dev = host.to(self.device, non_blocking=True)
        compute.wait_stream(self._copy_stream)
        dev.record_stream(compute)
        return dev

    def execute(self, inputs: StepInputs) -> torch.Tensor:
        md = inputs.attn
        if self._graph_bucket(md.num_decodes, md.num_prefills == 0) is not None:
            return self.model.compute_logits(self.graphs.replay(inputs.input_ids, inputs.positions, md))
        with forward_context(md):
            hidden = self.model(inputs.input_ids, inputs.positions)
        return self.model.compute_logits(hidden[inputs.logits_indices])

    @torch.inference_mode()
    def serve_forever(self) -> None:
        """Non-zero tensor-parallel ranks: run whatever rank 0 broadcasts until it says stop."""
        while True:
            header = torch.empty(_HEADER, dtype=torch.int64, device=self.device)
            dist.broadcast(header, 0)
            header = header.cpu()
            if header[0] == _STOP:
                break
            t, b, width = (int(x) for x in header[1:4])
            units = int(header[9])
            payload = torch.empty(3 * t + 3 * b + 1 + b * width + PLAN_ROWS * units, dtype=torch.int64,
                                  device=self.device)
            dist.broadcast(payload, 0)
            self.execute(self._unpack(header, payload))
        self._leave_group()

    def stop_workers(self) -> None:
        if self.world > 1 and dist.is_initialized():
            header = torch.zeros(_HEADER, dtype=torch.int64)
            dist.broadcast(header.to(self.device), 0)
            self._leave_group()

    def _leave_group(self) -> None:
        """Destroy the tensor-parallel group, after the CUDA graphs that captured its all-reduces: destroying
        it under live graphs hung every rank (2xH200)."""
        self.graphs = None
        gc.collect()
        dist.destroy_process_group()

    def close(self) -> None:
        """Stop TP workers and give this runner's GPU memory back (weights, KV pool, graph pool)."""
        self.stop_workers()
        self.graphs = self.model = self.kv_pool = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # ---- inputs -------------------------------------------------------------------------------------
    def _pack(self, batch: ScheduledBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Host tensors: the header, one int64 payload, and (dst, src) rows of PENDING input tokens."""
        bs = self.config.block_size
        ids, positions, slots = [], [], []
        seq_lens, qsl = [], [0]
        dst, src = [], []
        width = max(len(seq.block_table) for seq in batch.seqs)
        tables = np.zeros((len(batch.seqs), width), np.int64)
        for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens)):
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            table = seq.block_table
            tables[i, :len(table)] = table
            if n == 1:  # a decode: plain ints beat numpy for one token
                if seq.token_ids[start] == PENDING:
                    launch, row = seq.sample_ref
                    assert launch == self._launches, f"{seq}: its pending token is not from the last step"
                    dst.append(len(ids))
                    src.append(row)
                ids.append(seq.token_ids[start])
                positions.append(start)
                slots.append(table[start // bs] * bs + start % bs)
            else:
                ids.extend(seq.token_ids[start:end])
                pos = np.arange(start, end)
                positions.extend(pos.tolist())
                slots.extend((tables[i, pos // bs] * bs + pos % bs).tolist())
            seq_lens.append(end)
            qsl.append(qsl[-1] + n)
        nd = batch.num_decodes
        prefill_q = [n for n in batch.num_new_tokens[nd:]]
        prefix_cached = any(l > n for l, n in zip(seq_lens[nd:], prefill_q))
        plan = self._decode_plan(seq_lens[:nd], batch.decode_only)
        header = torch.tensor([_RUN, qsl[-1], len(seq_lens), width, nd, max(batch.num_new_tokens), max(seq_lens),
                               int(prefix_cached), max(prefill_q, default=0), plan.shape[1]])
        qsl_arr = np.asarray(qsl)
        payload = np.concatenate([np.asarray(ids + positions + slots, np.int64), qsl_arr, np.asarray(seq_lens),
                                  tables.ravel(), qsl_arr[1:] - 1, plan.ravel()])
        payload = torch.from_numpy(payload)
        pending = torch.tensor([dst, src], dtype=torch.int64) if dst else None
        return header, payload, pending

    def _graph_bucket(self, num_decodes: int, decode_only: bool) -> int | None:
        """The batch size of the CUDA graph a step replays; None: the step runs eagerly."""
        if self.graphs is None or not decode_only or num_decodes > self.graphs.max_batch_size:
            return None
        return self.graphs.bucket(num_decodes)

    def _decode_plan(self, decode_lens: list[int], decode_only: bool) -> np.ndarray:
        """How the Triton decode kernel cuts these contexts ([5, units]; no columns: one unit a sequence), for
        the batch it will see: a CUDA graph's padded one when the step replays a graph."""
        table = None
        if decode_lens and self.backend.name != "torch":
            batch = self._graph_bucket(len(decode_lens), decode_only) or len(decode_lens)
            table = plan_table(decode_lens, self.layout.num_kv_heads, self.device, batch=batch)
        return np.zeros((PLAN_ROWS, 0), np.int64) if table is None else table

    def _unpack(self, header: torch.Tensor, payload: torch.Tensor) -> StepInputs:
        _, t, b, width, nd, max_q, max_k, prefix_cached, max_prefill_q, units = (int(x) for x in header.tolist())
        ids, positions, slots, qsl, seq_lens, tables, logits_idx, plan = payload.split(
            [t, t, t, b + 1, b, b * width, b, PLAN_ROWS * units])
        qsl32 = qsl.int()
        prefill_qsl = (qsl32[nd:] - nd) if nd < b else None
        attn = AttentionMetadata(
            num_decodes=nd, num_decode_tokens=nd, slot_mapping=slots, query_start_loc=qsl32,
            seq_lens=seq_lens.int(), block_tables=tables.view(b, width).int(), max_query_len=max_q,
            max_seq_len=max_k, prefix_cached=bool(prefix_cached), prefill_query_start_loc=prefill_qsl,
            max_prefill_query_len=max_prefill_q,
            decode_plan=DecodePlan(plan.view(PLAN_ROWS, units).int(), True) if units else DecodePlan(None, False))
        return StepInputs(ids, positions, logits_idx, attn)

    def _sampling_batch(self, seqs: list[Sequence]) -> SamplingBatch:
        generators = []
        for seq in seqs:
            if seq.sampling.seed is not None and seq.generator is None:
                seq.generator = torch.Generator(self.device).manual_seed(seq.sampling.seed)
            generators.append(seq.generator)
        return SamplingBatch.build([s.sampling for s in seqs], generators, self.config.model_config.vocab_size,
                                   self.device, [s.num_tokens for s in seqs], self._upload)
