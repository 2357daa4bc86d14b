"""Reference attention ops in plain torch: the CPU path, and the oracle for every GPU kernel."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def store_kvcache(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor) -> None:
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    block_size = k_cache.shape[1]
    blocks, offsets = slot_mapping // block_size, slot_mapping % block_size
    k_cache[blocks, offsets] = key
    v_cache[blocks, offsets] = value


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The first `seq_len` cached tokens of one sequence: [seq_len, Hkv, D]."""
    block_size = cache.shape[1]
    num_blocks = (seq_len + block_size - 1) // block_size
    return cache[block_table[:num_blocks].long()].flatten(0, 1)[:seq_len]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [Lq, Hq, D] attends causally to k/v [Lk, Hkv, D] whose last Lq rows are the queries' own."""
    lq, lk = q.shape[0], k.shape[0]
    mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(diagonal=lk - lq)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                         attn_mask=mask, scale=scale, enable_gqa=True)
    return out.transpose(0, 1)


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """Causal attention over packed fresh sequences (no cached prefix)."""
    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end > start:  # an empty sequence: a CUDA graph's unused slot (prefill_graph.py)
            out[start:end] = _attend(q[start:end], k[start:end], v[start:end], scale)
    return out


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                            max_query_len: int, scale: float) -> torch.Tensor:
    out = torch.empty_like(q)
    bounds, lens = query_start_loc.tolist(), seq_lens.tolist()
    for i, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        if end == start:  # an empty sequence: a CUDA graph's unused slot (prefill_graph.py)
            continue
        k = gather_kv(k_cache, block_tables[i], lens[i])
        v = gather_kv(v_cache, block_tables[i], lens[i])
        out[start:end] = _attend(q[start:end], k, v, scale)
    return out


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                           plan: object = None) -> torch.Tensor:
    """One query per sequence; all sequences in one padded, masked attention call (`plan`, the Triton
    kernel's work split, does not apply)."""
    block_size = k_cache.shape[1]
    max_len = int(seq_lens.max())
    tables = block_tables[:, :(max_len + block_size - 1) // block_size].long()
    b = q.shape[0]
    k = k_cache[tables].flatten(1, 2)[:, :max_len].transpose(1, 2)  # [B, Hkv, L, D]
    v = v_cache[tables].flatten(1, 2)[:, :max_len].transpose(1, 2)
    mask = (torch.arange(max_len, device=q.device) < seq_lens.unsqueeze(1)).view(b, 1, 1, max_len)
    # Padding rows hold whatever the pool has there (NaN included): 0 * NaN would leak through p @ V.
    pad = ~mask.view(b, 1, max_len, 1)
    k, v = k.masked_fill(pad, 0), v.masked_fill(pad, 0)
    out = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    return out.squeeze(2)
