"""A LLaMA-style decoder laid out as HF transformers' `modeling_llama.py` and Meta's reference
`model.py` lay it out, written here from scratch and shrunk for tests. What sets it apart from
the GPT assets: RMSNorm instead of LayerNorm (no mean, no bias), in three spellings:
  "hf":    hidden.to(float32); variance = h.pow(2).mean(-1, keepdim=True);
           h * rsqrt(variance + eps); weight * h.to(input_dtype)
  "meta":  x.float() * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps), .type_as(x), * weight
  "torch": torch.nn.RMSNorm
a SwiGLU MLP without biases, down(silu(gate(x)) * up(x)); rotary position embeddings
(rotate_half on cos/sin buffers); bias-free q/k/v/o projections; pre-norm residual blocks.
Input: int64 token ids (B, T); output: logits (B, T, vocab). `make(size="bench")` is the size
benchmarks/llama_parts.py and the docs' fused-mode figures use (4 layers of width 256, hidden
688, 256 tokens, vocabulary 4096); the default is tiny for tests."""
import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, CONTEXT = 50, 16
SIZES = {"tiny": dict(dim=32, heads=4, hidden=88, layers=2, vocab=VOCAB, context=CONTEXT),
         "bench": dict(dim=256, heads=8, hidden=688, layers=4, vocab=4096, context=256)}


class HFRMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class MetaRMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float()).type_as(x)
        return output * self.weight


NORMS = {"hf": HFRMSNorm, "meta": MetaRMSNorm, "torch": lambda d: nn.RMSNorm(d, eps=1e-6)}


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, dim, heads, context):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        freqs = torch.outer(torch.arange(context).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        cos, sin = self.cos[:t], self.sin[:t]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, dim, heads, hidden, norm, context):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = NORMS[norm](dim), NORMS[norm](dim)
        self.self_attn, self.mlp = Attention(dim, heads, context), MLP(dim, hidden)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, dim, heads, hidden, layers, vocab, context, norm="hf"):
        super().__init__()
        self.vocab, self.context = vocab, context
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(DecoderLayer(dim, heads, hidden, norm, context)
                                    for _ in range(layers))
        self.norm = NORMS[norm](dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))

    def example_inputs(self, batch_size: int, device, dtype):
        return (torch.randint(0, self.vocab, (batch_size, self.context), device=device),)


def make(norm="hf", size="tiny"):
    return Llama(norm=norm, **SIZES[size])


def make_meta(size="tiny"):
    return make("meta", size)


def make_torch_rmsnorm(size="tiny"):
    return make("torch", size)
