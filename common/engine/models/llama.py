"""Llama-family decoder (Llama, Mistral, Qwen2, Qwen3): they differ only in qkv bias and per-head q/k norm."""
from __future__ import annotations

import torch
from torch import nn

from common.config import ModelConfig
from common.engine.layers.attention import Attention
from common.engine.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from common.engine.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from common.engine.layers.norm import RMSNorm
from common.engine.layers.partial_sums import PartialSums
from common.engine.layers.rotary import RotaryEmbedding


class SelfAttention(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.qkv_proj = QKVParallelLinear(c.hidden_size, c.head_dim, c.num_heads, c.num_kv_heads, bias=c.qkv_bias)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.head_dim = c.head_dim
        self.o_proj = RowParallelLinear(c.num_heads * c.head_dim, c.hidden_size)
        self.rotary_emb = RotaryEmbedding(c.head_dim, c.max_position_embeddings, c.rope_theta, c.rope_scaling)
        self.attn = Attention(self.num_heads, self.num_kv_heads, c.head_dim, c.head_dim ** -0.5)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps) if c.qk_norm else None
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps) if c.qk_norm else None

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor | PartialSums:
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = self.qkv_proj(x).split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        attn = self.attn(positions, q, k, v, self.rotary_emb, self.q_norm, self.k_norm).flatten(1)
        return self.o_proj(attn, to_norm=True)


class MLP(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(c.hidden_size, [c.intermediate_size] * 2)
        self.down_proj = RowParallelLinear(c.intermediate_size, c.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor | PartialSums:
        # down(silu(gate) * up): the down projection applies the activation (for a few rows, as it loads x)
        return self.down_proj(self.gate_up_proj(x), silu_and_mul=True, to_norm=True)


class DecoderLayer(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = SelfAttention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None):
        if residual is None:
            x, residual = self.input_layernorm(x), x
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class DecoderModel(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            x, residual = layer(positions, x, residual)
        x, _ = self.norm(x, residual)
        return x


class CausalLM(nn.Module):
    # checkpoint name piece -> (packed parameter, shard id)
    packed_modules = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.config = c
        self.model = DecoderModel(c)
        self.lm_head = ParallelLMHead(c.vocab_size, c.hidden_size)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def sample_one_pass(self, hidden: torch.Tensor, temperatures: torch.Tensor, seeds: torch.Tensor,
                        out: torch.Tensor) -> torch.Tensor:
        """The one-pass sampler's tokens (greedy and Gumbel-max rows) for `hidden`, written into `out`."""
        return self.lm_head.sample_one_pass(hidden, temperatures, seeds, out)

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.model.layers]
