"""The models the end-to-end loop serves: each computes a request's missing tokens layer by layer.

A model here has a ``spec`` (its KV page), ``make_pool(num_pages, device, reserved)`` (its L1 pool,
laid out as its attention reads it) and ``prefill(tokens, kv) -> tensor`` (the forward of the
tokens from ``kv.compute_from`` on, waiting per layer through ``kv``; it returns the last token's
logits, or for a stand-in some value of the last token). Three of them:

- ``TinyAttentionLM``: a few layers of real attention in plain torch (the CPU test's model): it
  reads every key and value from the paged L1 pool, loaded or computed.
- ``HFCausalLM``: a transformers causal LM (Llama-shaped; random weights are fine) driven layer by
  layer with ``RequestKV`` as its cache: the model's own projections, rotary embedding, MLP and
  attention kernels (``config._attn_implementation``, sdpa by default) run on the paged KV.
- ``NSAStandIn``: DeepSeek-V3.2's NSA cache (61 layers, page 64, fp8 latent + indexer keys) with a
  per-layer compute stand-in: bf16 GEMMs doing the FLOPs ``DeepSeekV32Flops`` counts for one GPU of
  an 8-GPU deployment, after reading the layer's latent and indexer keys of every page of the
  prompt (what the sparse attention and the indexer read).

transformers is imported by the caller, never here: ``HFCausalLM`` takes a built model.
This is benchmark code; it must not be used on a serving path.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...model.device_pool import DevicePool, allocate_engine_like
from ...model.spec import KVSpec, mha_spec, nsa_spec
from .e2e_kv import RequestKV, mha_pool


# --- a tiny model in plain torch -----------------------------------------------------------------
class TinyAttentionLM(torch.nn.Module):
    """Embedding, ``layers`` x (RMS norm, grouped-query attention over the paged KV, MLP), LM head.

    ``chunk_tokens``: prefill in page-aligned chunks of at most this many tokens. The CPU test sets
    the page size, so a recomputed prompt and one with a loaded prefix compute their last chunk
    with the same shapes and get bitwise identical logits.
    """

    def __init__(self, *, layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2, head_dim: int = 16,
                 vocab: int = 512, page_size: int = 16, chunk_tokens: int | None = None, seed: int = 0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)

        def weight(*shape: int) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.randn(*shape, generator=gen) / math.sqrt(shape[0]), requires_grad=False)

        self.spec = mha_spec(layers, page_size, kv_heads, head_dim, "fp32")
        self.heads, self.kv_heads, self.head_dim, self.vocab = heads, kv_heads, head_dim, vocab
        self.chunk_tokens = chunk_tokens
        self.embed = weight(vocab, hidden)
        self.position = weight(8192, hidden)
        self.wq = torch.nn.ParameterList([weight(hidden, heads * head_dim) for _ in range(layers)])
        self.wk = torch.nn.ParameterList([weight(hidden, kv_heads * head_dim) for _ in range(layers)])
        self.wv = torch.nn.ParameterList([weight(hidden, kv_heads * head_dim) for _ in range(layers)])
        self.wo = torch.nn.ParameterList([weight(heads * head_dim, hidden) for _ in range(layers)])
        self.w1 = torch.nn.ParameterList([weight(hidden, 4 * hidden) for _ in range(layers)])
        self.w2 = torch.nn.ParameterList([weight(4 * hidden, hidden) for _ in range(layers)])
        self.lm_head = weight(hidden, vocab)

    def make_pool(self, num_pages: int, device: torch.device | str, reserved: tuple[int, ...]) -> DevicePool:
        return mha_pool(self.spec, num_pages, device, reserved)

    @staticmethod
    def _norm(x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor, kv: RequestKV) -> torch.Tensor:
        x = None
        for start, end in kv.chunks(self.chunk_tokens):
            kv.begin_chunk(start, end)
            count = end - start
            x = (self.embed[tokens[start:end] % self.vocab] + self.position[torch.arange(start, end) % 8192])[None]
            for i in range(len(self.wq)):
                h = self._norm(x)
                q = (h @ self.wq[i]).view(1, count, self.heads, self.head_dim).transpose(1, 2)
                k = (h @ self.wk[i]).view(1, count, self.kv_heads, self.head_dim).transpose(1, 2)
                v = (h @ self.wv[i]).view(1, count, self.kv_heads, self.head_dim).transpose(1, 2)
                keys, values = kv.update(k, v, i)
                group = self.heads // self.kv_heads
                keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
                mask = kv.attention_mask()
                out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=mask is None and count > 1)
                x = x + out.transpose(1, 2).reshape(1, count, -1) @ self.wo[i]
                x = x + torch.relu(self._norm(x) @ self.w1[i]) @ self.w2[i]
        assert x is not None
        return self._norm(x[0, -1]) @ self.lm_head


# --- a transformers causal LM ---------------------------------------------------------------------
class HFCausalLM:
    """A transformers ``*ForCausalLM`` (Llama-shaped: ``model.model.{embed_tokens, rotary_emb, layers,
    norm}``, ``model.lm_head``) whose decoder layers read and write the paged L1 pool through
    ``RequestKV`` (its ``update`` is the transformers ``Cache`` call each attention layer makes)."""

    def __init__(self, model, *, page_size: int = 64, chunk_tokens: int | None = None) -> None:
        config = model.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dtype = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[model.dtype]
        self.model = model
        self.vocab = config.vocab_size
        self.chunk_tokens = chunk_tokens
        self.spec = mha_spec(config.num_hidden_layers, page_size, config.num_key_value_heads, head_dim, dtype)
        self.device = next(model.parameters()).device

    def make_pool(self, num_pages: int, device: torch.device | str, reserved: tuple[int, ...]) -> DevicePool:
        return mha_pool(self.spec, num_pages, device, reserved)

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor, kv: RequestKV) -> torch.Tensor:
        inner = self.model.model
        hidden = None
        for start, end in kv.chunks(self.chunk_tokens):
            kv.begin_chunk(start, end)
            ids = (tokens[start:end] % self.vocab)[None]
            hidden = inner.embed_tokens(ids)
            positions = torch.arange(start, end, device=ids.device)[None]
            rotary = inner.rotary_emb(hidden, positions)
            mask = kv.attention_mask()
            for layer in inner.layers:
                hidden = layer(hidden, attention_mask=mask, position_ids=positions, past_key_values=kv,
                               position_embeddings=rotary)
        assert hidden is not None
        return self.model.lm_head(inner.norm(hidden[:, -1:]))[0, -1].float()


def llama3_8b_config(**overrides):
    """A Llama-3-8B-shaped ``LlamaConfig`` (transformers imported here, on the caller's machine)."""
    from transformers import LlamaConfig

    values = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=65536,
                  rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                  tie_word_embeddings=False)
    values.update(overrides)
    config = LlamaConfig(**values)
    config._attn_implementation = overrides.get("attn_implementation", "sdpa")
    return config


def build_hf_llama(config, device: torch.device | str, dtype: torch.dtype = torch.bfloat16):
    """``LlamaForCausalLM`` with random weights made on ``device`` (no download, no CPU copy)."""
    from transformers import LlamaForCausalLM

    with torch.device(device):
        model = LlamaForCausalLM._from_config(config, dtype=dtype)
    return model.eval()


# --- DeepSeek-V3.2: NSA cache, compute stand-in --------------------------------------------------
@dataclass(frozen=True)
class DeepSeekV32Flops:
    """FLOPs of one DeepSeek-V3.2 layer per token on one GPU of a ``gpus``-GPU deployment.

    The model (config of DeepSeek-V3.2-Exp: hidden 7168, 128 heads, q_lora 1536, kv_lora 512, rope
    64, nope 128, v 128; 256 routed experts of 2048, 8 active + 1 shared; 3 dense layers of 18432;
    indexer 64 heads x 128, top-k 2048), counting a multiply-add as 2 FLOPs:

    - projections per token: q_a 7168x1536, q_b 1536x(128x192), kv_a 7168x576, kv_b absorbed into
      the query and the output (2 x 128x128x512, the latent form the sparse kernel computes), o
      128x128x7168, indexer q 1536x(64x128), k 7168x128 and head weights 7168x64;
    - FFN per token: 9 experts x 3 x 7168x2048 (+ the 7168x256 router); the 3 dense layers'
      3 x 7168x18432 is the same count, so every layer is counted alike;
    - sparse attention per query: 2 x 128 heads x (576 + 512) per selected key, min(position, 2048)
      keys; the indexer per query: 2 x 64 x 128 per earlier key (fp8 in the model, counted here at
      the bf16 rate);
    - per GPU: ``gpus``-way tensor parallel attention (heads and indexer heads split, the latent
      and indexer keys replicated, so every GPU holds and loads every page) and expert parallel MoE
      (each GPU a ``1/gpus`` share of the active experts' work on average): everything / ``gpus``.

    So a token costs 1.195 GFLOP of projections and FFN per layer (73 GFLOP over 61 layers: the
    37B active parameters), 150 MFLOP per GPU of 8, plus attention that grows with its position.
    """

    gpus: int = 8
    hidden: int = 7168
    heads: int = 128
    q_lora: int = 1536
    kv_lora: int = 512
    rope: int = 64
    nope: int = 128
    v_dim: int = 128
    expert_ffn: int = 2048
    experts_active: int = 9  # 8 routed + 1 shared
    routed_experts: int = 256
    index_heads: int = 64
    index_dim: int = 128
    top_k: int = 2048

    @property
    def linear_per_token(self) -> float:
        h, n = self.hidden, self.heads
        params = (h * self.q_lora + self.q_lora * n * (self.nope + self.rope) + h * (self.kv_lora + self.rope)
                  + 2 * n * self.nope * self.kv_lora + n * self.v_dim * h
                  + self.q_lora * self.index_heads * self.index_dim + h * self.index_dim + h * self.index_heads
                  + self.experts_active * 3 * h * self.expert_ffn + h * self.routed_experts)
        return 2.0 * params / self.gpus

    def layer(self, start: int, end: int) -> float:
        """FLOPs of one layer for the tokens at positions ``[start, end)`` on one GPU."""
        count = end - start
        # sum over positions p in [start, end) of (p + 1) and of min(p + 1, top_k)
        keys_all = (start + 1 + end) * count / 2
        capped_end = min(end, self.top_k)
        keys_sparse = 0.0
        if start < capped_end:
            keys_sparse += (start + 1 + capped_end) * (capped_end - start) / 2
        keys_sparse += self.top_k * max(0, end - max(start, self.top_k))
        per_key_sparse = 2.0 * self.heads * (self.kv_lora + self.rope + self.kv_lora)
        per_key_index = 2.0 * self.index_heads * self.index_dim
        return count * self.linear_per_token + (keys_sparse * per_key_sparse + keys_all * per_key_index) / self.gpus


class NSAStandIn:
    """DeepSeek-V3.2's NSA cache on L1, with a per-layer compute stand-in (see the module docstring).

    Per layer: wait for the layer's load, read the layer's latent and indexer keys of every page of
    the prompt, run bf16 GEMMs of the model's hidden width (``[T, 7168] x [7168, n]``) that add up to
    ``DeepSeekV32Flops.layer`` for the chunk, then the computed full pages get their KV. Its time is
    those FLOPs at the rate this GPU reaches for that token count (``gemm_rates`` measures it). The
    partial tail page gets no KV (it is never stored); what it returns is a value of the last token.
    """

    def __init__(self, device: torch.device | str, *, num_layers: int = 61, flops: DeepSeekV32Flops = DeepSeekV32Flops(),
                 seed: int = 0) -> None:
        self.spec: KVSpec = nsa_spec(num_layers, 64, "fp8")
        self.flops = flops
        self.device = torch.device(device)
        gen = torch.Generator().manual_seed(seed)
        width = flops.hidden
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.weight = (torch.randn(width, width, generator=gen) / math.sqrt(width)).to(self.device, dtype)
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        self.gemm_flops = 0.0

    def make_pool(self, num_pages: int, device: torch.device | str, reserved: tuple[int, ...]) -> DevicePool:
        return allocate_engine_like(self.spec, num_pages, device=device, reserved_pages=reserved)

    def _buffer(self, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._buffers is None or self._buffers[0].shape[0] < tokens:
            width = self.flops.hidden
            a = torch.randn(tokens, width, device=self.device).to(self.weight.dtype)
            self._buffers = (a, torch.empty_like(a))
        return self._buffers

    def gemm_plan(self, tokens: int, flops: float) -> list[int]:
        """Output widths of the GEMMs ``[tokens, 7168] x [7168, n]`` that do ``flops``."""
        width = self.flops.hidden
        per_column = 2.0 * tokens * width
        columns = max(64, int(round(flops / per_column / 64)) * 64)
        plan = [width] * (columns // width)
        if columns % width:
            plan.append(columns % width)
        return plan

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor, kv: RequestKV) -> torch.Tensor:
        start, end = kv.compute_from, kv.num_tokens
        kv.begin_chunk(start, end)
        count = end - start
        plan = self.gemm_plan(count, self.flops.layer(start, end))
        a, b = self._buffer(count)
        src, dst = a[:count], b[:count]
        pool = kv.pool
        for layer in range(self.spec.num_layers):
            kv.wait(layer)
            latent = pool.chunk_view(0, layer).index_select(0, kv.page_index)
            index_keys = pool.chunk_view(1, layer).index_select(0, kv.page_index)
            for columns in plan:
                torch.mm(src, self.weight[:, :columns], out=dst[:, :columns])
                src, dst = dst, src
            kv.written(layer, end)
            del latent, index_keys
        self.gemm_flops += sum(2.0 * count * self.flops.hidden * c for c in plan) * self.spec.num_layers
        return src[-1].float().sum()


def gemm_rates(device: torch.device | str, token_counts: tuple[int, ...], *, width: int = 7168,
               repeats: int = 10) -> dict[int, float]:
    """Measured bf16 GEMM rate (TFLOP/s) of ``[T, width] x [width, width]`` per token count T."""
    device = torch.device(device)
    weight = torch.randn(width, width, device=device, dtype=torch.bfloat16)
    rates = {}
    for tokens in token_counts:
        a = torch.randn(tokens, width, device=device, dtype=torch.bfloat16)
        out = torch.empty_like(a)
        for _ in range(3):
            torch.mm(a, weight, out=out)
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(repeats):
            torch.mm(a, weight, out=out)
        torch.cuda.synchronize(device)
        seconds = (time.perf_counter() - start) / repeats
        rates[tokens] = 2.0 * tokens * width * width / seconds / 1e12
        del a, out
    return rates


__all__ = ["DeepSeekV32Flops", "HFCausalLM", "NSAStandIn", "TinyAttentionLM", "build_hf_llama", "gemm_rates",
           "llama3_8b_config"]
