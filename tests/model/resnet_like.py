"""A small ResNet in torchvision's layout (stem, layer1..layer2 of Bottleneck-style blocks
whose first has a downsample, avgpool, fc), written here so that no test needs
torchvision. Its forward calls every layer: it cannot skip a missing one."""

import torch
import torch.nn.functional as F
from torch import nn


class Bottleneck(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                           if stride != 1 or cin != cout else None)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet(nn.Module):
    def __init__(self, width: int = 8, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.layer1 = nn.Sequential(Bottleneck(width, width), Bottleneck(width, width))
        self.layer2 = nn.Sequential(Bottleneck(width, 2 * width, 2), Bottleneck(2 * width, 2 * width),
                                    Bottleneck(2 * width, 2 * width))
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def model(width: int = 8) -> ResNet:
    return ResNet(width)


def batch(micro_batch_size: int, model=None, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(micro_batch_size, 3, 8, 8, generator=gen),
            torch.randint(0, 10, (micro_batch_size,), generator=gen))


def loss(outputs, targets):
    return F.cross_entropy(outputs, targets)
