"""A LLaMA decoder laid out as HF transformers' current `modeling_llama.py` lays it out (the
shape Qwen2, Mistral and Gemma share), written here from scratch and shrunk for tests. What
sets it apart from tests/assets/llama.py:
- heads shaped with a star-unpacked shape, `hidden_shape = (*input_shape, -1, head_dim)` and
  `.reshape(*input_shape, -1)` on the way out (a Proxy iterated: fx stops there);
- the attention written out in a module-level function (`eager_attention_forward`: repeat_kv
  for grouped k/v heads, `matmul * scaling`, an additive mask sliced to the keys,
  `softmax(dtype=float32).to(q.dtype)`, dropout by `module.training`) that also returns the
  weights, which the decoder layer drops;
- the rotary embedding as its own module called once per model, its float32 math inside
  `with torch.autocast(device_type=..., enabled=False)`, the device type read from a tensor;
- a config object, keyword calls, `**kwargs` passed through, `(output, weights)` tuples;
- decorators as transformers 5 puts them: the model's forward behind a `(self, *args,
  **kwargs)` wrapper that reads a keyword (`can_return_tuple`'s shape), RMSNorm's forward
  replaced by a hub-kernel wrapper (`kernels`' `use_kernel_forward_from_hub`), and the rotary
  function routed through a stateless per-model module kept in a dict, not a submodule
  (`use_kernel_func_from_hub`).
Input: int64 token ids (B, T); output: logits (B, T, vocab)."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F



@dataclass
class Config:
    vocab_size: int = 50
    hidden_size: int = 32
    intermediate_size: int = 88
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2           # grouped-query attention: 2 query heads per k/v head
    max_position_embeddings: int = 16
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    attention_dropout: float = 0.0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def kernel_forward_from_hub(cls):
    """Replaces cls.forward with a wrapper that would route to a downloaded kernel."""
    own = cls.forward

    @functools.wraps(own)
    def forward(self, *args, **kwargs):
        return own(self, *args, **kwargs)
    cls.forward = forward
    return cls


def kernel_function_from_hub(fn):
    """Calls fn through a stateless module kept per process, where a hub kernel would go."""
    class Layer(nn.Module):
        def forward(self, *args, **kwargs):
            return fn(*args, **kwargs)
    layers: dict = {}

    @functools.wraps(fn)
    def call(*args, **kwargs):
        return layers.setdefault("layer", Layer())(*args, **kwargs)
    return call


def return_tuple_on_request(fn):
    """`return_tuple=True` (a keyword the forward does not name) gives `(output,)`."""
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        as_tuple = kwargs.pop("return_tuple", False)
        out = fn(self, *args, **kwargs)
        return (out,) if as_tuple else out
    return wrapper


@kernel_forward_from_hub
class RMSNorm(nn.Module):
    """HF's spelling (each modeling file has its own): float32 statistics, cast back."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class RotaryEmbedding(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        d = config.head_dim
        steps = torch.arange(0, d, 2, dtype=torch.int64).float() / d
        inv_freq = 1.0 / (config.rope_theta ** steps)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.attention_scaling = 1.0

    def forward(self, x, position_ids):
        freq = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        pos = position_ids[:, None, :].float()
        device_type = x.device.type if isinstance(x.device.type, str) else "cpu"
        with torch.autocast(device_type=device_type, enabled=False):   # angles in float32
            angles = (freq.float() @ pos.float()).transpose(1, 2)
            emb = torch.cat((angles, angles), dim=-1)
            cos, sin = emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@kernel_function_from_hub
def apply_rotary(q, k, cos, sin, unsqueeze_dim=1):
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def repeat_kv(states, n_rep: int):
    """(B, kv heads, T, d) -> (B, kv heads * n_rep, T, d), each k/v head shared by n_rep."""
    batch, kv_heads, length, dim = states.shape
    if n_rep == 1:
        return states
    states = states[:, :, None, :, :].expand(batch, kv_heads, n_rep, length, dim)
    return states.reshape(batch, kv_heads * n_rep, length, dim)


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0,
                            **kwargs):
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask[:, :, :, : key_states.shape[-2]]
    weights = F.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    out = torch.matmul(weights, value_states)
    return out.transpose(1, 2).contiguous(), weights


class Attention(nn.Module):
    def __init__(self, config: Config, layer_idx: int):
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        self.head_dim = config.head_dim
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim ** -0.5
        self.attention_dropout = config.attention_dropout
        h, kv = config.num_attention_heads, config.num_key_value_heads
        self.q_proj = nn.Linear(config.hidden_size, h * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(h * self.head_dim, config.hidden_size, bias=False)

    def forward(self, hidden_states, position_embeddings, attention_mask=None, **kwargs):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        query, key = apply_rotary(query, key, cos, sin)
        out, weights = eager_attention_forward(
            self, query, key, value, attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling, **kwargs)
        out = out.reshape(*input_shape, -1).contiguous()
        return self.o_proj(out), weights


class MLP(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        d, hidden = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: Config, layer_idx: int):
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, hidden_states, attention_mask=None, position_ids=None,
                position_embeddings=None, **kwargs):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states,
                                          attention_mask=attention_mask,
                                          position_ids=position_ids,
                                          position_embeddings=position_embeddings, **kwargs)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.mlp(self.post_attention_layernorm(hidden_states))
        return residual + hidden_states


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i)
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @return_tuple_on_request
    def forward(self, input_ids, position_ids=None, **kwargs):
        hidden_states = self.embed_tokens(input_ids)
        length = hidden_states.shape[1]
        if position_ids is None:
            position_ids = torch.arange(length, device=hidden_states.device).unsqueeze(0)
        # additive causal mask, (1, 1, T, T): float32's lowest above the diagonal
        future = torch.ones(length, length, dtype=torch.bool, device=hidden_states.device).triu(1)
        mask = torch.zeros(length, length, dtype=hidden_states.dtype,
                           device=hidden_states.device).masked_fill(
            future, torch.finfo(torch.float32).min)[None, None]
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask=mask, position_ids=position_ids,
                                  position_embeddings=position_embeddings, **kwargs)
        return self.lm_head(self.norm(hidden_states))

    def example_inputs(self, batch_size: int, device, dtype):
        c = self.config
        return (torch.randint(0, c.vocab_size, (batch_size, c.max_position_embeddings),
                              device=device),)


SIZES = {"tiny": {}, "bench": dict(vocab_size=4096, hidden_size=256, intermediate_size=688,
                                   num_hidden_layers=4, num_attention_heads=8,
                                   num_key_value_heads=4, max_position_embeddings=256)}


def make(size: str = "tiny", **kw):
    return LlamaForCausalLM(Config(**{**SIZES[size], **kw}))
