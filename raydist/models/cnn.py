"""A small convolutional backbone for 8–64 px images (digits, thumbnails): conv blocks, then the map averaged
over a coarse grid of cells (1×1: a global average pool) and flattened, so the head can see where things are."""

from __future__ import annotations

import math

import torch
from torch import nn


class SmallCNN(nn.Module):
    """``depth`` blocks of conv3×3 → GroupNorm → ReLU → 2×2 max-pool (ceil mode, so a 1×1 map stays 1×1), the
    block widths doubling from ``width``; then the map averaged over a ``grid``×``grid`` of cells (adaptive average
    pooling; ``grid=1`` is the global mean) and flattened: [B, C, H, W] → [B, ``out_dim`` = C_last·grid²].

    A global mean throws away *where* a feature is; on small images where position carries the signal (a
    digit's half, a stroke's place) a 2×2 grid keeps a coarse layout for the head (the CIFAR-ResNet habit of
    keeping layout through the stem, applied at the pool).

    GroupNorm, not BatchNorm: it normalises each image on its own, so a row's features never depend on the
    other rows of its batch. BatchNorm's batch statistics are noisy at the few rows per worker a DDP run has,
    differ between workers (unless synchronised, one more collective per layer per step), change between
    train and eval, and let a ranking loss over the batch read the other rows through them.
    """

    def __init__(
        self, channels: int, width: int = 32, depth: int = 3, groups: int = 8, grid: int = 1
    ) -> None:
        super().__init__()
        if min(channels, width, depth, groups, grid) < 1:
            raise ValueError(
                f"channels, width, depth, groups and grid must be positive, got "
                f"{channels}, {width}, {depth}, {groups}, {grid}"
            )
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
        self.grid = grid
        self.out_dim = c_in * grid * grid

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        maps = self.features(images)
        if self.grid == 1:
            return maps.mean(dim=(2, 3))
        return nn.functional.adaptive_avg_pool2d(maps, self.grid).flatten(1)
