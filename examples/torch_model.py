"""The nn.Module both PyTorch example processes build (same names and shapes on each side)."""

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, width=256):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 10))
        self.norm = nn.LayerNorm(10)

    def forward(self, x):
        return self.norm(self.mlp(x))


def build(dtype="float32", seed=None):
    if seed is not None:
        torch.manual_seed(seed)
    return Net().to(getattr(torch, dtype))
