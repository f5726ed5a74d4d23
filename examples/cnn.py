"""A small ResNet-style CNN (identical residual blocks after a stem); no tensor parallelism.

    smplan profile examples/cnn.py --arg blocks=8 --arg channels=64 --arg image=32
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ResidualBlock(nn.Module):
    """He et al. 2016 basic block: two 3x3 convolutions with batch norm, identity shortcut."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(y)))


class Stem(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(3, channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class Head(nn.Module):
    def __init__(self, channels: int, classes: int):
        super().__init__()
        self.fc = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.mean(dim=(2, 3)))


class CNN(nn.Module):
    def __init__(self, blocks: int, channels: int, image: int, classes: int):
        super().__init__()
        self.config = dict(blocks=blocks, channels=channels, image=image, classes=classes)
        self.embed = Stem(channels)
        self.blocks = nn.Sequential(*(ResidualBlock(channels) for _ in range(blocks)))
        self.head = Head(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks:
            if block is not None:
                x = block(x)
        return self.head(x) if self.head is not None else x


def model(blocks: int = 4, channels: int = 16, image: int = 16, classes: int = 10) -> CNN:
    return CNN(blocks, channels, image, classes)


def batch(micro_batch_size: int, model: CNN | None = None, seed: int = 0):
    cfg = model.config if model is not None else dict(image=16, classes=10)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(micro_batch_size, 3, cfg["image"], cfg["image"], generator=gen)
    y = torch.randint(0, cfg["classes"], (micro_batch_size,), generator=gen)
    return x, y


def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs.float(), targets)
