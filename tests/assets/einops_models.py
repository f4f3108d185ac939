"""Models written with einops and einsum, as two widely copied codebases write them, in our own
words and shrunk for tests:

- `SpatialTransformer`: Stable Diffusion v1's (CompVis latent-diffusion
  `ldm/modules/attention.py`) layout. Heads folded into the batch with
  `rearrange(t, "b n (h d) -> (b h) n d")`, scores by `einsum("b i d, b j d -> b i j") * scale`,
  an optional mask filled with `-finfo.max`, `sim.softmax(dim=-1)`, `einsum("b i j, b j d ->
  b i d")`; a block of self-attention, cross-attention on a context (keys and values from
  `context if given else x`) and a GEGLU feed-forward; around it GroupNorm, 1x1 convs and
  `rearrange(x, "b c h w -> b (h w) c")`. forward(x, context=None).
- `ViT`: lucidrains' vit-pytorch layout. Patches by an einops `Rearrange` layer, the class token
  by `repeat`, q / k / v by `qkv.chunk(3, dim=-1)` and `map(lambda t: rearrange(t, "b n (h d)
  -> b h n d"), qkv)`, `torch.matmul(q, k.transpose(-1, -2)) * scale`, an nn.Softmax module,
  pre-norm MLPs as nn.Sequential(LayerNorm, Linear, GELU, Dropout, Linear, Dropout).

Before fx/leaves.py both failed to trace wherever einops was called."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange, repeat
from einops.layers.torch import Rearrange


def present(v):
    return v is not None


def either(v, fallback):
    return v if present(v) else fallback


class CrossAttention(nn.Module):
    def __init__(self, query_dim, context_dim=None, heads=4, dim_head=8, dropout=0.0):
        super().__init__()
        inner = dim_head * heads
        context_dim = either(context_dim, query_dim)
        self.scale, self.heads = dim_head ** -0.5, heads
        self.to_q = nn.Linear(query_dim, inner, bias=False)
        self.to_k = nn.Linear(context_dim, inner, bias=False)
        self.to_v = nn.Linear(context_dim, inner, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner, query_dim), nn.Dropout(dropout))

    def forward(self, x, context=None, mask=None):
        h = self.heads
        q = self.to_q(x)
        context = either(context, x)
        k, v = self.to_k(context), self.to_v(context)
        q, k, v = map(lambda t: rearrange(t, "b n (h d) -> (b h) n d", h=h), (q, k, v))
        sim = torch.einsum("b i d, b j d -> b i j", q, k) * self.scale
        if present(mask):
            mask = repeat(rearrange(mask, "b ... -> b (...)"), "b j -> (b h) () j", h=h)
            sim = sim.masked_fill(~mask, -torch.finfo(sim.dtype).max)
        attn = sim.softmax(dim=-1)
        out = torch.einsum("b i j, b j d -> b i d", attn, v)
        return self.to_out(rearrange(out, "(b h) n d -> b n (h d)", h=h))


class GEGLU(nn.Module):
    def __init__(self, dim_in, dim_out):
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out * 2)

    def forward(self, x):
        x, gate = self.proj(x).chunk(2, dim=-1)
        return x * F.gelu(gate)


class FeedForward(nn.Module):
    def __init__(self, dim, mult=4, dropout=0.0):
        super().__init__()
        self.net = nn.Sequential(GEGLU(dim, dim * mult), nn.Dropout(dropout),
                                 nn.Linear(dim * mult, dim))

    def forward(self, x):
        return self.net(x)


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim, heads, dim_head, context_dim=None):
        super().__init__()
        self.attn1 = CrossAttention(dim, heads=heads, dim_head=dim_head)
        self.ff = FeedForward(dim)
        self.attn2 = CrossAttention(dim, context_dim, heads=heads, dim_head=dim_head)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)

    def forward(self, x, context=None):
        x = self.attn1(self.norm1(x)) + x
        x = self.attn2(self.norm2(x), context=context) + x
        return self.ff(self.norm3(x)) + x


class SpatialTransformer(nn.Module):
    """Image features (B, C, H, W), and a context (B, T, context_dim) to attend to."""

    def __init__(self, channels=32, heads=4, dim_head=8, depth=1, context_dim=24, latent=8):
        super().__init__()
        self.latent = latent
        inner = heads * dim_head
        self.norm = nn.GroupNorm(8, channels, eps=1e-6)
        self.proj_in = nn.Conv2d(channels, inner, 1)
        self.transformer_blocks = nn.ModuleList(
            BasicTransformerBlock(inner, heads, dim_head, context_dim) for _ in range(depth))
        self.proj_out = nn.Conv2d(inner, channels, 1)
        self.to_k_width = context_dim or inner

    def example_inputs(self, batch_size: int, device, dtype):
        """A (latent x latent) latent and a 77-token context."""
        g = torch.Generator().manual_seed(0)
        side = self.latent
        x = torch.randn(batch_size, self.proj_out.out_channels, side, side, generator=g)
        context = torch.randn(batch_size, 77, self.to_k_width, generator=g)
        return x.to(device, dtype), context.to(device, dtype)

    def forward(self, x, context=None):
        b, c, h, w = x.shape
        x_in = x
        x = self.proj_in(self.norm(x))
        x = rearrange(x, "b c h w -> b (h w) c")
        for block in self.transformer_blocks:
            x = block(x, context=context)
        x = rearrange(x, "b (h w) c -> b c h w", h=h, w=w)
        return self.proj_out(x) + x_in


class Attention(nn.Module):
    def __init__(self, dim, heads=4, dim_head=8, dropout=0.0):
        super().__init__()
        inner = dim_head * heads
        self.heads, self.scale = heads, dim_head ** -0.5
        self.norm = nn.LayerNorm(dim)
        self.attend = nn.Softmax(dim=-1)
        self.dropout = nn.Dropout(dropout)
        self.to_qkv = nn.Linear(dim, inner * 3, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner, dim), nn.Dropout(dropout))

    def forward(self, x):
        x = self.norm(x)
        qkv = self.to_qkv(x).chunk(3, dim=-1)
        q, k, v = map(lambda t: rearrange(t, "b n (h d) -> b h n d", h=self.heads), qkv)
        dots = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        attn = self.dropout(self.attend(dots))
        out = torch.matmul(attn, v)
        return self.to_out(rearrange(out, "b h n d -> b n (h d)"))


class Transformer(nn.Module):
    def __init__(self, dim, depth, heads, dim_head, mlp_dim, dropout=0.0):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.layers = nn.ModuleList()
        for _ in range(depth):
            self.layers.append(nn.ModuleList([
                Attention(dim, heads=heads, dim_head=dim_head, dropout=dropout),
                nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, mlp_dim), nn.GELU(),
                              nn.Dropout(dropout), nn.Linear(mlp_dim, dim), nn.Dropout(dropout)),
            ]))

    def forward(self, x):
        for attn, ff in self.layers:
            x = attn(x) + x
            x = ff(x) + x
        return self.norm(x)


class ViT(nn.Module):
    def __init__(self, image_size=16, patch_size=4, num_classes=10, dim=32, depth=2, heads=4,
                 mlp_dim=64, channels=3, dim_head=8):
        super().__init__()
        patches = (image_size // patch_size) ** 2
        patch_dim = channels * patch_size * patch_size
        self.to_patch_embedding = nn.Sequential(
            Rearrange("b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=patch_size, p2=patch_size),
            nn.LayerNorm(patch_dim), nn.Linear(patch_dim, dim), nn.LayerNorm(dim))
        self.pos_embedding = nn.Parameter(torch.randn(1, patches + 1, dim))
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim))
        self.transformer = Transformer(dim, depth, heads, dim_head, mlp_dim)
        self.mlp_head = nn.Linear(dim, num_classes)
        self.image_size = image_size

    def example_inputs(self, batch_size: int, device, dtype):
        g = torch.Generator().manual_seed(0)
        return (torch.randn(batch_size, 3, self.image_size, self.image_size,
                            generator=g).to(device, dtype),)

    def forward(self, img):
        x = self.to_patch_embedding(img)
        b, n, _ = x.shape
        cls_tokens = repeat(self.cls_token, "1 1 d -> b 1 d", b=b)
        x = torch.cat((cls_tokens, x), dim=1)
        x = x + self.pos_embedding[:, :(n + 1)]
        x = self.transformer(x)
        return self.mlp_head(x[:, 0])


SIZES = {   # "bench": Stable Diffusion v1's first level; ViT-Tiny's width, 4 layers
    "sd": {"bench": dict(channels=320, heads=8, dim_head=40, context_dim=768),
           "tiny": dict(channels=32, heads=2, dim_head=16, context_dim=24)},
    "vit": {"bench": dict(image_size=224, patch_size=16, dim=192, depth=4, heads=3,
                          dim_head=64, mlp_dim=768, num_classes=1000),
            "tiny": dict(image_size=16, patch_size=4, dim=32, depth=1, heads=2, dim_head=16,
                         mlp_dim=64)},
}


def make_sd(size: str | None = None, **kw):
    return SpatialTransformer(**{**SIZES["sd"][size], **kw}) if size else SpatialTransformer(**kw)


def make_vit(size: str | None = None, **kw):
    return ViT(**{**SIZES["vit"][size], **kw}) if size else ViT(**kw)
