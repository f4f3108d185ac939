"""A Swin Transformer stage laid out as microsoft/Swin-Transformer's `models/swin_transformer.py`
writes it, in our own words and shrunk for tests: window attention with a learned relative
position bias (`q = q * scale; attn = q @ k^T + bias[index].view(...)`), a shifted-window mask
added through a 5-D view of the scores (`attn.view(B_ // nW, nW, heads, N, N) +
mask.unsqueeze(1).unsqueeze(0)`, then viewed back), nn.Softmax, `window_partition` /
`window_reverse` (whose `int(windows.shape[0] / ...)` stops fx, so each block is traced in
parts), `assert L == H * W` in the block, Mlp = fc1, GELU, Dropout, fc2, Dropout. Input:
(B, H*W, C) tokens; output the same."""
import torch
import torch.nn as nn

RES, DIM, HEADS, WINDOW = 8, 32, 2, 4


def window_partition(x, ws):
    B, H, W, C = x.shape
    x = x.view(B, H // ws, ws, W // ws, ws, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, ws, ws, C)


def window_reverse(windows, ws, H, W):
    B = int(windows.shape[0] / (H * W / ws / ws))
    x = windows.view(B, H // ws, W // ws, ws, ws, -1)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(B, H, W, -1)


class Mlp(nn.Module):
    def __init__(self, dim, hidden, drop=0.0):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x):
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class WindowAttention(nn.Module):
    def __init__(self, dim, window, heads):
        super().__init__()
        self.window, self.heads = window, heads
        self.scale = (dim // heads) ** -0.5
        self.relative_position_bias_table = nn.Parameter(
            torch.randn((2 * window - 1) ** 2, heads) * 0.02)
        coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window),
                                            indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()
        rel[:, :, 0] += window - 1
        rel[:, :, 1] += window - 1
        rel[:, :, 0] *= 2 * window - 1
        self.register_buffer("relative_position_index", rel.sum(-1))
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)
        self.attn_drop, self.proj_drop = nn.Dropout(0.0), nn.Dropout(0.0)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x, mask=None):
        B_, N, C = x.shape
        qkv = self.qkv(x).reshape(B_, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        q = q * self.scale
        attn = q @ k.transpose(-2, -1)
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(
            self.window * self.window, self.window * self.window, -1)
        attn = attn + bias.permute(2, 0, 1).contiguous().unsqueeze(0)
        if mask is not None:
            nW = mask.shape[0]
            attn = attn.view(B_ // nW, nW, self.heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.heads, N, N)
            attn = self.softmax(attn)
        else:
            attn = self.softmax(attn)
        attn = self.attn_drop(attn)
        x = (attn @ v).transpose(1, 2).reshape(B_, N, C)
        return self.proj_drop(self.proj(x))


class SwinTransformerBlock(nn.Module):
    def __init__(self, dim, resolution, heads, window, shift):
        super().__init__()
        self.resolution, self.window, self.shift = resolution, window, shift
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, window, heads)
        self.mlp = Mlp(dim, 4 * dim)
        mask = None
        if shift > 0:
            H = W = resolution
            img = torch.zeros(1, H, W, 1)
            cnt = 0
            cuts = (slice(0, -window), slice(-window, -shift), slice(-shift, None))
            for h in cuts:
                for w in cuts:
                    img[:, h, w, :] = cnt
                    cnt += 1
            wins = window_partition(img, window).view(-1, window * window)
            mask = wins.unsqueeze(1) - wins.unsqueeze(2)
            mask = mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)
        self.register_buffer("attn_mask", mask)

    def forward(self, x):
        H = W = self.resolution
        B, L, C = x.shape
        assert L == H * W, "input feature has wrong size"
        shortcut = x
        x = self.norm1(x).view(B, H, W, C)
        if self.shift > 0:
            x = torch.roll(x, shifts=(-self.shift, -self.shift), dims=(1, 2))
        windows = window_partition(x, self.window).view(-1, self.window * self.window, C)
        windows = self.attn(windows, mask=self.attn_mask)
        x = window_reverse(windows.view(-1, self.window, self.window, C), self.window, H, W)
        if self.shift > 0:
            x = torch.roll(x, shifts=(self.shift, self.shift), dims=(1, 2))
        x = shortcut + x.view(B, H * W, C)
        return x + self.mlp(self.norm2(x))


class SwinStage(nn.Module):
    """Two blocks: windows as they fall, then shifted by half a window."""

    def __init__(self, dim=DIM, resolution=RES, heads=HEADS, window=WINDOW, depth=2):
        super().__init__()
        self.resolution = resolution
        self.blocks = nn.ModuleList(
            SwinTransformerBlock(dim, resolution, heads, window, 0 if i % 2 == 0 else window // 2)
            for i in range(depth))
        self.norm = nn.LayerNorm(dim)

    def example_inputs(self, batch_size: int, device, dtype):
        g = torch.Generator().manual_seed(0)
        return (torch.randn(batch_size, self.resolution ** 2, self.norm.normalized_shape[0],
                            generator=g).to(device, dtype),)

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x)
