"""A small convolutional backbone for 8–64 px images (digits, thumbnails): conv blocks and a global average pool."""

from __future__ import annotations

import math

import torch
from torch import nn


class SmallCNN(nn.Module):
    """``depth`` blocks of conv3×3 → GroupNorm → ReLU → 2×2 max-pool (ceil mode, so a 1×1 map stays 1×1), the
    block widths doubling from ``width``; then the mean over positions: [B, C, H, W] → [B, ``out_dim``].

    GroupNorm, not BatchNorm: it normalises each image on its own, so a row's features never depend on the
    other rows of its batch. BatchNorm's batch statistics are noisy at the few rows per worker a DDP run has,
    differ between workers (unless synchronised, one more collective per layer per step), change between
    train and eval, and let a ranking loss over the batch read the other rows through them.
    """

    def __init__(self, channels: int, width: int = 32, depth: int = 3, groups: int = 8) -> None:
        super().__init__()
        if min(channels, width, depth, groups) < 1:
            raise ValueError(f"channels, width, depth and groups must be positive, got "
                             f"{channels}, {width}, {depth}, {groups}")  # fmt: skip
        layers: list[nn.Module] = []
        c_in = channels
        for block in range(depth):
            c_out = width * 2**block
            layers += [
                nn.Conv2d(c_in, c_out, kernel_size=3, padding=1, bias=False),
                nn.GroupNorm(math.gcd(groups, c_out), c_out),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(2, ceil_mode=True),
            ]
            c_in = c_out
        self.features = nn.Sequential(*layers)
        self.out_dim = c_in

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.features(images).mean(dim=(2, 3))
