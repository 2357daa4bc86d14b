from __future__ import annotations

import gc
import logging

import numpy as np
import torch
import torch.distributed as dist

from common.config import EngineConfig
from common.engine.attention.choice import create_backend
from common.engine.context import forward_context
from common.engine.cuda_graph import GraphRunner, block_table_width
from common.engine.device import mps_share, torch_dtype
from common.engine.in_flight import InFlight
from common.engine.kv_pool import KVPool
from common.engine.layers.fusion import fused_kernels
from common.engine.layers.sampler import SamplingBatch, sample, seeded_generators
from common.engine.loader import init_dummy_weights, load_weights
from common.engine.mps_check import check_under_cap
from common.engine.models.llama import CausalLM
from common.engine.prefill_graph import MAX_SEQS, PrefillGraphRunner, prefill_graph_sizes
from common.engine.sampler_graph import SamplerGraphs
from common.engine.scheduler import ScheduledBatch
from common.engine.sequence import Sequence
from common.engine.step_inputs import (HEADER_SIZE, STOP, PackedStep, StepHeader, StepInputs, pack_step,
                                       split_step, unpack_step, warmup_step)
from common.engine.step_sizes import padded_tokens
from common.engine.upload import upload
from common.protocol import KVLayout
from common.startup import Startup

log = logging.getLogger(__name__)


class ModelRunner:
    """Owns the model, its KV pool and the device; turns a scheduled batch into sampled tokens.

    Rank 0 builds each step's inputs and broadcasts them (a StepHeader, then one int64 payload) to the other
    tensor-parallel ranks, which run the same forward (`serve_forever`).
    """

    def __init__(self, config: EngineConfig, rank: int = 0, init_method: str | None = None):
        self.config = config
        self.rank, self.world = rank, config.tensor_parallel_size
        self.graphs: GraphRunner | None = None  # decode steps'
        self.sampler_graphs: SamplerGraphs | None = None  # decode steps' LM head and one-pass sampler
        self.prefill_graphs: PrefillGraphRunner | None = None  # prompt steps'
        self._launches = 0
        self._last_tokens: torch.Tensor | None = None
        self.startup = Startup()
        with self.startup.timed("model"):
            self._load_model(init_method)
        with self.startup.timed("KV pool"):
            self._make_kv_pool()
        if config.device == "cuda" and not config.enforce_eager and self.backend.supports_graphs:
            self._capture_graphs()

    def _load_model(self, init_method: str | None) -> None:
        """The device, the tensor-parallel group, the model with its weights and its attention backend."""
        config, rank = self.config, self.rank
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
        if self.device.type == "cuda":
            check_under_cap(self.model, config.max_num_batched_tokens, mps_share())
        attn_layers = self.model.attention_layers()
        self.backend = create_backend(config.attention_backend, self.device, attn_layers[0].num_kv_heads)
        for layer in attn_layers:
            layer.backend = self.backend
        self.pads_steps = self.device.type == "cuda"  # steps with prefills run at a padded token count (_pad)
        self._copy_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def _make_kv_pool(self) -> None:
        """As many KV blocks as the memory left for them holds (`_num_kv_blocks`), each layer given its caches."""
        config, attn_layers = self.config, self.model.attention_layers()
        mc = config.model_config
        self.layout = KVLayout(block_size=config.block_size, num_layers=mc.num_layers,
                               num_kv_heads=attn_layers[0].num_kv_heads, head_dim=mc.head_dim, dtype=config.dtype_name)
        self.kv_pool = KVPool(self.layout, self._num_kv_blocks(), self.device)
        for i, layer in enumerate(attn_layers):
            layer.k_cache, layer.v_cache = self.kv_pool.k_cache(i), self.kv_pool.v_cache(i)

    def _capture_graphs(self) -> None:
        cfg = self.config
        max_len = min(cfg.max_model_len, self.num_blocks * cfg.block_size)
        max_bs = cfg.max_num_seqs if cfg.cuda_graph_max_bs is None else min(cfg.max_num_seqs, cfg.cuda_graph_max_bs)
        if max_bs:
            with self.startup.timed("decode graphs"):
                self.graphs = GraphRunner(self.model, self.backend, max_bs, max_len, cfg.block_size,
                                          cfg.model_config.hidden_size, self.dtype, self.device)
                self.graphs.capture()
                self._capture_sampler_graphs()
        sizes = prefill_graph_sizes(cfg.max_num_batched_tokens, cfg.prefill_graph_max_tokens)
        if sizes and self.backend.supports_prefill_graphs(self.dtype):
            with self.startup.timed("prompt graphs"):
                self.prefill_graphs = PrefillGraphRunner(
                    self.model, sizes, min(MAX_SEQS, cfg.max_num_seqs), block_table_width(max_len, cfg.block_size),
                    max_len, cfg.model_config.hidden_size, self.dtype, self.device)
                self.prefill_graphs.capture()

    def _capture_sampler_graphs(self) -> None:
        """One rank only: with tensor parallelism the LM head gathers the vocabulary across ranks, and the other
        ranks, which sample nothing, would have to replay the same graphs in step."""
        if self.world == 1 and fused_kernels() is not None:
            self.sampler_graphs = SamplerGraphs(self.model.sample_one_pass, self.graphs.hidden, self.graphs.sizes)
            self.sampler_graphs.capture(self.graphs.pool)

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
        # every rank runs this forward in its own start-up, so rank 0 does not send it (`forward_fresh`)
        largest = min(cfg.max_num_batched_tokens, cfg.max_model_len * cfg.max_num_seqs)
        self.execute(unpack_step(*self._fresh_step(largest)))
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        peak = torch.cuda.max_memory_allocated()
        # Only this runner's own use counts against its share: other engines may live in this process.
        budget = min(total * cfg.gpu_memory_utilization - (peak - self._memory_at_start), free * 0.98)
        return int(budget // self.layout.block_bytes)

    @torch.inference_mode()
    def forward_fresh(self, num_tokens: int) -> None:
        """Rank 0: one forward of `num_tokens` prompt tokens that stores and reads no KV, to meet a step size's GEMM
        shapes before serving (warmup.py); the other tensor-parallel ranks run it too."""
        header, payload = self._fresh_step(num_tokens)
        self._send_to_ranks(header, payload)
        self.execute(unpack_step(header, payload))

    def _fresh_step(self, num_tokens: int) -> tuple[StepHeader, torch.Tensor]:
        """`num_tokens` fresh prompt tokens, as many max_model_len prompts as that takes, on the device."""
        seq_len = min(self.config.max_model_len, num_tokens)
        lens = [seq_len] * (num_tokens // seq_len) + ([num_tokens % seq_len] if num_tokens % seq_len else [])
        step = warmup_step(lens)
        return step.header, step.payload.to(self.device)

    def _send_to_ranks(self, header: StepHeader, payload: torch.Tensor) -> None:
        """Rank 0, before each forward it runs: the other ranks wait in `serve_forever` for the step, and a forward
        they were not sent would pair its all-reduces with their wait for the next header, hanging the group."""
        if self.world > 1:
            dist.broadcast(header.pack().to(self.device), 0)
            dist.broadcast(payload, 0)

    # ---- one step -----------------------------------------------------------------------------------
    @torch.inference_mode()
    def launch(self, batch: ScheduledBatch) -> InFlight:
        """Queues the step's forward and sampling on the GPU and returns without waiting for them.

        Inputs go up on a copy stream; a PENDING input token (sampled by the previous launch, not yet seen
        by the CPU) is gathered from that launch's tokens on the device. The sampled tokens come back
        through pinned memory and an event: no device-wide sync.
        """
        step = self.pack(batch)
        sampling = self._sampling_batch(batch.seqs)
        run = step.pending.run() if step.pending is not None else None
        indexed = [] if step.pending is None or run is not None else [step.pending.tensor()]
        payload, *rest = upload([step.payload, *indexed, *sampling.tensors()], self.device, self._copy_stream)
        if run is not None:
            dst, src, n = run
            payload[dst:dst + n] = self._last_tokens[src:src + n]
        elif indexed:
            dst, src = rest.pop(0).unbind(0)
            payload[dst] = self._last_tokens[src]
        sampling = sampling.uploaded(rest)
        self._send_to_ranks(step.header, payload)
        started = InFlight.mark() if self.device.type == "cuda" else None
        tokens = self._sample(unpack_step(step.header, payload), sampling)
        self._launches += 1
        self._last_tokens = tokens
        for row, seq in enumerate(batch.seqs):
            seq.sample_ref = (self._launches, row)
        return InFlight.start(tokens, started)

    def run(self, batch: ScheduledBatch) -> list[int]:
        """One step, waiting for its tokens."""
        return self.launch(batch).tokens()

    def pack(self, batch: ScheduledBatch) -> PackedStep:
        """The step's inputs on the host (rank 0)."""
        return pack_step(batch, self.config.block_size, self._launches, self._plan,
                         self._pad if self.pads_steps else None)

    def _pad(self, num_tokens: int, num_decodes: int) -> int:
        """A step with prefills runs its prompt tokens at a padded count (a prompt graph's size, or a GEMM shape
        warm-up met): all of its tokens when it runs eagerly, the prompts' alone when its decodes replay a graph
        (`execute`)."""
        split = num_decodes if self._graph_bucket(num_decodes) else 0
        return split + padded_tokens(num_tokens - split, self.config.max_num_batched_tokens)

    def _plan(self, decode_lens: list[int], decode_only: bool) -> np.ndarray | None:
        """The backend's plan for the decodes as its kernel will see them: padded to the graph's bucket when the
        step replays one."""
        batch = self._graph_bucket(len(decode_lens)) or len(decode_lens)
        return self.backend.plan_step(decode_lens, batch)

    def _graph_bucket(self, num_decodes: int) -> int | None:
        """The batch size of the CUDA graph a step's decodes replay (with or without prompts beside them); None:
        they run eagerly (no graphs, no decodes, or more than the largest graph)."""
        if self.graphs is None or not num_decodes:
            return None
        return self.graphs.bucket(num_decodes, decode_only=True)

    def execute(self, inputs: StepInputs) -> torch.Tensor:
        """The step's logits, a row a sequence (decodes first). Decodes replay their CUDA graph even beside prompts,
        and the prompts run on their own (`_prompts`), so running decodes keep their graph's pace."""
        attn = inputs.attn
        if not attn.num_decodes:
            return self.model.compute_logits(self._prompts(inputs))
        bucket = self._graph_bucket(attn.num_decodes)
        if bucket is None:
            return self.model.compute_logits(self._eager(inputs))
        if attn.decode_only:
            return self.model.compute_logits(self.graphs.replay(inputs, bucket))
        decodes, prompts = split_step(inputs)
        hidden = self.graphs.replay(decodes, bucket)
        return self.model.compute_logits(torch.cat([hidden, self._prompts(prompts)]))

    def _sample(self, inputs: StepInputs, sampling: SamplingBatch) -> torch.Tensor:
        """The step's tokens. A decode-only step that replays a graph and samples in one pass replays the LM head and
        the sampler in a graph too; any other step samples `execute`'s logits eagerly."""
        attn = inputs.attn
        graphed = self.sampler_graphs is not None and attn.decode_only and sampling.one_pass
        bucket = self._graph_bucket(attn.num_decodes) if graphed else None
        if bucket is None:
            return sample(self.execute(inputs), sampling)
        self.graphs.replay(inputs, bucket)
        return self.sampler_graphs.replay(bucket, sampling)

    def _prompts(self, inputs: StepInputs) -> torch.Tensor:
        """The hidden states of a prompt step's last new tokens: its CUDA graph replayed where one holds it."""
        t = self.prefill_graphs.bucket(inputs) if self.prefill_graphs is not None else None
        return self._eager(inputs) if t is None else self.prefill_graphs.replay(inputs, t)

    def _eager(self, inputs: StepInputs) -> torch.Tensor:
        """The hidden states of each sequence's last new token, from a forward without a graph."""
        with forward_context(self.backend.prepare_metadata(inputs.attn)):
            hidden = self.model(inputs.input_ids, inputs.positions)
        return hidden[inputs.logits_indices]

    @torch.inference_mode()
    def serve_forever(self) -> None:
        """Non-zero tensor-parallel ranks: run whatever rank 0 broadcasts until it says stop."""
        while True:
            packed = torch.empty(HEADER_SIZE, dtype=torch.int64, device=self.device)
            dist.broadcast(packed, 0)
            header = StepHeader.unpack(packed.cpu())
            if header.stop:
                break
            payload = torch.empty(header.payload_size, dtype=torch.int64, device=self.device)
            dist.broadcast(payload, 0)
            self.execute(unpack_step(header, payload))
        self._leave_group()

    def stop_workers(self) -> None:
        if self.world > 1 and dist.is_initialized():
            dist.broadcast(STOP.pack().to(self.device), 0)
            self._leave_group()

    def _leave_group(self) -> None:
        """Destroy the tensor-parallel group, after the CUDA graphs that captured its all-reduces: destroying
        it under live graphs hung every rank (2xH200)."""
        self.graphs = self.sampler_graphs = self.prefill_graphs = None
        gc.collect()
        dist.destroy_process_group()

    def close(self) -> None:
        """Stop TP workers and give this runner's GPU memory back (weights, KV pool, graphs and their buffers)."""
        self.stop_workers()
        self.graphs = self.sampler_graphs = self.prefill_graphs = self.model = self.kv_pool = self.backend = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _sampling_batch(self, seqs: list[Sequence]) -> SamplingBatch:
        """The step's sampling settings, on the host: `launch` uploads them with its inputs."""
        params, positions = [s.sampling for s in seqs], [s.num_tokens for s in seqs]
        return SamplingBatch.on_host(params, seeded_generators(params, positions, self.device),
                                     self.config.model_config.vocab_size, self.device, positions)
