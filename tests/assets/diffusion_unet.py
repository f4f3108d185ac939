"""A small diffusion UNet (a test asset in our own words), with the blocks written the ways the
diffusion code people train writes them:
  - diffusers' ResnetBlock2D: nn.GroupNorm -> nn.SiLU -> conv, the time embedding projected and
    added per channel, `(shortcut(x) + h) / output_scale_factor`;
  - guided-diffusion's and LDM's (Stable Diffusion's UNet) ResBlock: `in_layers` /
    `out_layers` Sequentials of GroupNorm32 (a GroupNorm subclass computing in float32:
    `super().forward(x.float()).type(x.dtype)`), nn.SiLU, a Dropout and a conv;
  - the CompVis VAE's `Normalize` (GroupNorm, eps 1e-6) with a written-out swish,
    `x * torch.sigmoid(x)`, and its single-head attention block over 1x1-conv q, k, v;
  - sinusoidal timestep embeddings through Linear -> SiLU -> Linear, skip connections
    concatenated on the way up, nearest-neighbour upsampling.
Inputs: a noisy image batch (B, 3, S, S) and int64 timesteps (B,) (`example_inputs`); output:
the predicted noise, (B, 3, S, S). GroupNorm32 fails in float64, as the original does (its
float32 input meets float64 parameters): `make_plain` has nn.GroupNorm there. `make(size="bench")` is the size benchmarks/unet_parts.py
times (32 groups, as the real models use)."""
from __future__ import annotations

import functools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

SIZES = {"tiny": dict(ch=16, mult=(1, 2), groups=4, img=16),
         "bench": dict(ch=64, mult=(1, 2, 2), groups=32, img=32)}


def timestep_embedding(t, dim: int):
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32,
                                                        device=t.device) / half)
    args = t[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class GroupNorm32(nn.GroupNorm):
    def forward(self, x):
        return super().forward(x.float()).type(x.dtype)


def swish(x):
    return x * torch.sigmoid(x)


class ResnetBlock2D(nn.Module):
    """diffusers' layout and attribute names."""

    def __init__(self, cin, cout, temb, groups, output_scale_factor=1.0):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin, eps=1e-6, affine=True)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.time_emb_proj = nn.Linear(temb, cout)
        self.norm2 = nn.GroupNorm(groups, cout, eps=1e-6, affine=True)
        self.dropout = nn.Dropout(0.0)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.nonlinearity = nn.SiLU()
        self.conv_shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None
        self.output_scale_factor = output_scale_factor

    def forward(self, input_tensor, temb):
        hidden_states = self.norm1(input_tensor)
        hidden_states = self.nonlinearity(hidden_states)
        hidden_states = self.conv1(hidden_states)
        temb = self.time_emb_proj(self.nonlinearity(temb))[:, :, None, None]
        hidden_states = hidden_states + temb
        hidden_states = self.norm2(hidden_states)
        hidden_states = self.nonlinearity(hidden_states)
        hidden_states = self.dropout(hidden_states)
        hidden_states = self.conv2(hidden_states)
        if self.conv_shortcut is not None:
            input_tensor = self.conv_shortcut(input_tensor)
        return (input_tensor + hidden_states) / self.output_scale_factor


class ResBlock(nn.Module):
    """guided-diffusion's / LDM's layout: Sequentials, GroupNorm32."""

    def __init__(self, channels, emb_channels, out_channels, groups, norm=GroupNorm32):
        super().__init__()
        self.in_layers = nn.Sequential(norm(groups, channels), nn.SiLU(),
                                       nn.Conv2d(channels, out_channels, 3, padding=1))
        self.emb_layers = nn.Sequential(nn.SiLU(), nn.Linear(emb_channels, out_channels))
        self.out_layers = nn.Sequential(norm(groups, out_channels), nn.SiLU(),
                                        nn.Dropout(p=0.0),
                                        nn.Conv2d(out_channels, out_channels, 3, padding=1))
        self.skip_connection = (nn.Identity() if out_channels == channels
                                else nn.Conv2d(channels, out_channels, 1))

    def forward(self, x, emb):
        h = self.in_layers(x)
        emb_out = self.emb_layers(emb).type(h.dtype)
        h = h + emb_out[..., None, None]
        h = self.out_layers(h)
        return self.skip_connection(x) + h


class AttnBlock(nn.Module):
    """The CompVis VAE's: Normalize, 1x1-conv q / k / v, one head, a 1x1-conv projection."""

    def __init__(self, channels, groups):
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels, eps=1e-6, affine=True)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(channels, channels, 1)
                                                 for _ in range(4))

    def forward(self, x):
        h = self.norm(x)
        q, k, v = (t.flatten(2).transpose(1, 2) for t in (self.q(h), self.k(h), self.v(h)))
        h = F.scaled_dot_product_attention(q, k, v)
        return x + self.proj_out(h.transpose(1, 2).reshape(x.shape))


class UNet(nn.Module):
    def __init__(self, ch, mult, groups, img, norm32=True):
        super().__init__()
        res = functools.partial(ResBlock, groups=groups,
                                norm=GroupNorm32 if norm32 else nn.GroupNorm)
        self.ch, self.img = ch, img
        temb = 4 * ch
        self.time_embed = nn.Sequential(nn.Linear(ch, temb), nn.SiLU(), nn.Linear(temb, temb))
        self.conv_in = nn.Conv2d(3, ch, 3, padding=1)
        chans, c = [ch], ch
        self.down, self.downsample = nn.ModuleList(), nn.ModuleList()
        for i, m in enumerate(mult):   # diffusers' blocks, then a strided conv
            self.down.append(ResnetBlock2D(c, ch * m, temb, groups))
            c = ch * m
            chans.append(c)
            self.downsample.append(nn.Conv2d(c, c, 3, stride=2, padding=1)
                                   if i < len(mult) - 1 else nn.Identity())
        self.mid1 = res(c, temb, c)
        self.mid_attn = AttnBlock(c, groups)
        self.mid2 = res(c, temb, c)
        self.up, self.upconv = nn.ModuleList(), nn.ModuleList()
        for i, m in reversed(list(enumerate(mult))):
            self.up.append(res(c + chans.pop(), temb, ch * m))
            c = ch * m
            self.upconv.append(nn.Conv2d(c, c, 3, padding=1) if i > 0 else nn.Identity())
        self.norm_out = nn.GroupNorm(groups, c, eps=1e-6)
        self.conv_out = nn.Conv2d(c, 3, 3, padding=1)

    def forward(self, x, timesteps):
        emb = self.time_embed(timestep_embedding(timesteps, self.ch).to(x.dtype))
        h = self.conv_in(x)
        skips = []
        for block, down in zip(self.down, self.downsample):
            h = block(h, emb)
            skips.append(h)
            h = down(h)
        h = self.mid2(self.mid_attn(self.mid1(h, emb)), emb)
        for i, (block, upconv) in enumerate(zip(self.up, self.upconv)):
            h = block(torch.cat([h, skips.pop()], dim=1), emb)
            if i < len(self.up) - 1:
                h = upconv(F.interpolate(h, scale_factor=2.0, mode="nearest"))
        return self.conv_out(swish(self.norm_out(h)))

    def example_inputs(self, batch_size: int, device, dtype):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(batch_size, 3, self.img, self.img, generator=g).to(device, dtype)
        return x, torch.randint(0, 1000, (batch_size,), generator=g).to(device)


def make(size="tiny"):
    return UNet(**SIZES[size])


def make_plain(size="tiny"):
    """ResBlocks on nn.GroupNorm: GroupNorm32 computes in float32 next to the parameters'
    dtype, so a model with it cannot run in float64 at all (F.group_norm refuses the mix)."""
    return UNet(**SIZES[size], norm32=False)
