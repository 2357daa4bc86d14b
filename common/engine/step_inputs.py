"""A step's model inputs: packed on the host by rank 0 (one header, one int64 payload), unpacked into device
views on every tensor-parallel rank.

Payload sections, in order (T tokens, B sequences, decodes first): input ids [T], positions [T], slots [T],
query_start_loc [B+1], seq_lens [B], block tables [B * width], logits indices [B], the attention backend's
plan [plan_size]. The header says how long each is. Each section starts 16-byte aligned (padded to an even
count of int64s): a Triton kernel specializes on its pointers' alignment, and a view's alignment must not
depend on the step's sizes, or a step of odd length would compile variants that warm-up never ran.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable

import numpy as np
import torch

from common.engine.attention.metadata import AttentionInputs
from common.engine.scheduler import ScheduledBatch
from common.engine.sequence import PENDING


@dataclass(frozen=True)
class StepHeader:
    """The host ints of a step: what a tensor-parallel rank must know before it can receive the payload, and
    what attention reads without asking the device. Rank 0 broadcasts it `pack`ed; the others `unpack` it."""

    num_tokens: int
    num_seqs: int
    table_width: int  # block-table columns
    num_decodes: int
    max_query_len: int
    max_seq_len: int
    prefix_cached: bool  # a prefill has context beyond its own new tokens
    max_prefill_query_len: int
    plan_size: int  # ints of the attention backend's plan (AttentionBackend.plan_step)
    stop: bool = False  # no step: the other ranks leave their loop

    def sections(self) -> list[int]:
        """The payload's sections' lengths, in order (module docstring)."""
        t, b = self.num_tokens, self.num_seqs
        return [t, t, t, b + 1, b, b * self.table_width, b, self.plan_size]

    @property
    def payload_size(self) -> int:
        return sum(_aligned(n) for n in self.sections())

    def pack(self) -> torch.Tensor:
        return torch.tensor([int(getattr(self, name)) for name in _NAMES], dtype=torch.int64)

    @classmethod
    def unpack(cls, packed: torch.Tensor) -> StepHeader:
        return cls(*(kind(value) for kind, value in zip(_KINDS, packed.tolist())))


def _aligned(n: int) -> int:
    return n + (n & 1)


def _join(sections: list[np.ndarray]) -> np.ndarray:
    """The payload: each section at an even offset (module docstring)."""
    out = np.zeros(sum(_aligned(len(a)) for a in sections), np.int64)
    at = 0
    for a in sections:
        out[at:at + len(a)] = a
        at += _aligned(len(a))
    return out


_NAMES = tuple(f.name for f in fields(StepHeader))
_KINDS = tuple(bool if f.type == "bool" else int for f in fields(StepHeader))
HEADER_SIZE = len(_NAMES)
STOP = StepHeader(0, 0, 0, 0, 0, 0, False, 0, 0, stop=True)


@dataclass
class StepInputs:
    """A step's model inputs on the device: what every tensor-parallel rank runs the forward on."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    logits_indices: torch.Tensor  # [B] int64: the last new token of each sequence
    attn: AttentionInputs


def split_step(inputs: StepInputs) -> tuple[StepInputs, StepInputs]:
    """A step with decodes and prompts as two: its decodes alone (what a decode CUDA graph replays) and its prompts
    alone (an eager forward), each indexed from 0. Views, except the prompts' rebased offsets."""
    a, nd = inputs.attn, inputs.attn.num_decodes
    decodes = StepInputs(inputs.input_ids[:nd], inputs.positions[:nd], inputs.logits_indices[:nd], AttentionInputs(
        num_decodes=nd, slot_mapping=a.slot_mapping[:nd], query_start_loc=a.query_start_loc[:nd + 1],
        seq_lens=a.seq_lens[:nd], block_tables=a.block_tables[:nd], max_query_len=1, max_seq_len=a.max_seq_len,
        prefix_cached=False, max_prefill_query_len=0, plan=a.plan))
    prompts = StepInputs(inputs.input_ids[nd:], inputs.positions[nd:], inputs.logits_indices[nd:] - nd, AttentionInputs(
        num_decodes=0, slot_mapping=a.slot_mapping[nd:], query_start_loc=a.query_start_loc[nd:] - nd,
        seq_lens=a.seq_lens[nd:], block_tables=a.block_tables[nd:], max_query_len=a.max_prefill_query_len,
        max_seq_len=a.max_seq_len, prefix_cached=a.prefix_cached, max_prefill_query_len=a.max_prefill_query_len,
        plan=a.plan[:0]))
    return decodes, prompts


@dataclass(frozen=True)
class PendingRows:
    """Input ids still PENDING: payload index `dst[i]` takes row `src[i]` of the last launch's sampled tokens."""

    dst: list[int]
    src: list[int]

    def run(self) -> tuple[int, int, int] | None:
        """(first dst, first src, count) where both are runs of consecutive rows, as in a steady decode batch: then
        one slice copy on the device does, instead of an uploaded index pair, a gather and a scatter."""
        n, d, s = len(self.dst), self.dst[0], self.src[0]
        if self.dst[-1] - d == n - 1 and self.src == list(range(s, s + n)):  # dst only grows (pack_step)
            return d, s, n
        return None

    def tensor(self) -> torch.Tensor:
        """[2, n] int64: the dst row, then the src row."""
        return torch.tensor([self.dst, self.src], dtype=torch.int64)


@dataclass
class PackedStep:
    """A step's inputs on the host, as rank 0 sends them, and its PENDING input ids (None: it has none)."""

    header: StepHeader
    payload: torch.Tensor  # [header.payload_size] int64
    pending: PendingRows | None


# plan(decode context lengths, decode_only) -> the attention backend's plan for the batch the kernel will see
Planner = Callable[[list[int], bool], "np.ndarray | None"]


def pack_step(batch: ScheduledBatch, block_size: int, launch: int, plan: Planner,
              pad: Callable[[int, int], int] | None = None) -> PackedStep:
    """`launch`: the count of launches so far; a PENDING input must come from the last of them. `pad(tokens,
    decodes)`: the token count a step with prefills runs at (ModelRunner._pad); the padding tokens store nothing
    (slot -1) and are no sequence's, so attention and the logits never read them."""
    bs = block_size
    width = max(len(seq.block_table) for seq in batch.seqs)
    tables = np.zeros((len(batch.seqs), width), np.int64)
    # A prompt's tokens go in as one array each; a run of one-token rows (decodes) as plain ints, cheaper for one.
    ids: list[np.ndarray] = []
    positions: list[np.ndarray] = []
    one_ids: list[int] = []
    one_positions: list[int] = []
    seq_lens, qsl = [], [0]
    dst, src = [], []

    def end_run() -> None:
        if one_ids:
            ids.append(np.asarray(one_ids, np.int64))
            positions.append(np.asarray(one_positions, np.int64))
            one_ids.clear()
            one_positions.clear()

    for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens)):
        start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
        tables[i, :len(seq.block_table)] = seq.block_table
        if n == 1:
            token = seq.token_ids[start]
            if token == PENDING:
                last, row = seq.sample_ref
                assert last == launch, f"{seq}: its pending token is not from the last step"
                dst.append(qsl[-1])
                src.append(row)
            one_ids.append(token)
            one_positions.append(start)
        else:
            end_run()
            ids.append(np.asarray(seq.token_ids[start:end], np.int64))
            positions.append(np.arange(start, end, dtype=np.int64))
        seq_lens.append(end)
        qsl.append(qsl[-1] + n)
    end_run()
    num_new = np.asarray(batch.num_new_tokens)
    pos = np.concatenate(positions)
    slots = tables[np.repeat(np.arange(len(batch.seqs)), num_new), pos // bs] * bs + pos % bs
    ids_arr = np.concatenate(ids)
    nd = batch.num_decodes
    if pad is not None and not batch.decode_only:
        extra = pad(len(ids_arr), nd) - len(ids_arr)
        ids_arr = np.concatenate([ids_arr, np.zeros(extra, np.int64)])
        pos = np.concatenate([pos, np.zeros(extra, np.int64)])
        slots = np.concatenate([slots, np.full(extra, -1, np.int64)])
    prefill_q = batch.num_new_tokens[nd:]
    table = plan(seq_lens[:nd], batch.decode_only) if nd else None
    planned = np.zeros(0, np.int64) if table is None else table.ravel()
    header = StepHeader(
        num_tokens=len(ids_arr), num_seqs=len(seq_lens), table_width=width, num_decodes=nd,
        max_query_len=max(batch.num_new_tokens), max_seq_len=max(seq_lens),
        prefix_cached=any(l > n for l, n in zip(seq_lens[nd:], prefill_q)),
        max_prefill_query_len=max(prefill_q, default=0), plan_size=planned.size)
    qsl_arr = np.asarray(qsl)
    payload = _join([ids_arr, pos, slots, qsl_arr, np.asarray(seq_lens), tables.ravel(), qsl_arr[1:] - 1, planned])
    return PackedStep(header, torch.from_numpy(payload), PendingRows(dst, src) if dst else None)


def warmup_step(lens: list[int]) -> PackedStep:
    """Fresh prompts of these lengths that store nothing (slot -1) and read no cache: a forward to measure."""
    qsl = np.concatenate([[0], np.cumsum(lens)])
    positions = np.concatenate([np.arange(n) for n in lens])
    header = StepHeader(num_tokens=int(qsl[-1]), num_seqs=len(lens), table_width=0, num_decodes=0,
                        max_query_len=max(lens), max_seq_len=max(lens), prefix_cached=False,
                        max_prefill_query_len=max(lens), plan_size=0)
    payload = _join([np.zeros(qsl[-1], np.int64), positions, np.full(qsl[-1], -1), qsl, np.asarray(lens),
                     np.zeros(0, np.int64), qsl[1:] - 1, np.zeros(0, np.int64)])
    return PackedStep(header, torch.from_numpy(payload), None)


def unpack_step(header: StepHeader, payload: torch.Tensor) -> StepInputs:
    """Views into `payload` (on the model's device); nothing is copied or converted here."""
    sizes = header.sections()
    padded = payload.split([_aligned(n) for n in sizes])
    ids, positions, slots, qsl, seq_lens, tables, logits_indices, plan = (p[:n] for p, n in zip(padded, sizes))
    attn = AttentionInputs(
        num_decodes=header.num_decodes, slot_mapping=slots, query_start_loc=qsl, seq_lens=seq_lens,
        block_tables=tables.view(header.num_seqs, header.table_width), max_query_len=header.max_query_len,
        max_seq_len=header.max_seq_len, prefix_cached=header.prefix_cached,
        max_prefill_query_len=header.max_prefill_query_len, plan=plan)
    return StepInputs(ids, positions, logits_indices, attn)
