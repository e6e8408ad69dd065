"""Models: torchvision ResNet-18/34/50/101 and a tiny CNN for fast tests.

No weights are ever downloaded (``pretrained=True`` fetching at start-up, on every rank of
every node, is a classic of copied examples): ``weights=None`` always, and ``--weights PATH``
loads a local state_dict instead. The first conv follows the data's channels (1 for MNIST)
and the classifier the data's classes.
"""
from __future__ import annotations

import os
from typing import Optional

import torch
from torch import nn
from torchvision import models as tv_models

from .errors import ConfigError

_RESNETS = {
    "resnet18": tv_models.resnet18,
    "resnet34": tv_models.resnet34,
    "resnet50": tv_models.resnet50,
    "resnet101": tv_models.resnet101,
}


class TinyCNN(nn.Module):
    """Two convolutions and a linear layer: a few thousand parameters, milliseconds a step."""

    def __init__(self, in_channels: int, num_classes: int):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 8, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, kernel_size=3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def build_model(name: str, in_channels: int, num_classes: int,
                weights: Optional[str] = None) -> tuple[nn.Module, list[str]]:
    """The model, and the notes worth logging (which weights were loaded or skipped)."""
    if name == "tiny-cnn":
        model: nn.Module = TinyCNN(in_channels, num_classes)
    elif name in _RESNETS:
        model = _RESNETS[name](weights=None, num_classes=num_classes)
        if in_channels != 3:
            old = model.conv1
            model.conv1 = nn.Conv2d(in_channels, old.out_channels, kernel_size=old.kernel_size,
                                    stride=old.stride, padding=old.padding, bias=False)
    else:  # the config validates names; this guards direct callers
        raise ConfigError(f"--model: unknown model {name!r}")
    notes = load_weights(model, weights) if weights else []
    return model, notes


def load_weights(model: nn.Module, path: str) -> list[str]:
    """Load the tensors of a local state_dict whose names and shapes fit; report the rest.

    Fitting by shape lets ImageNet weights start an MNIST model: conv1 and fc are skipped.
    """
    if not os.path.isfile(path):
        raise ConfigError(f"--weights: {path} is not a file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ConfigError(f"--weights: {path} is not a loadable state_dict: {e}") from e
    if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
        state = state["model"]  # one of our own checkpoints
    if not isinstance(state, dict):
        raise ConfigError(f"--weights: {path} holds a {type(state).__name__}, not a state_dict")
    own = model.state_dict()
    fitting = {k: v for k, v in state.items()
               if k in own and isinstance(v, torch.Tensor) and v.shape == own[k].shape}
    if not fitting:
        raise ConfigError(f"--weights: no tensor in {path} fits the model")
    model.load_state_dict(fitting, strict=False)
    skipped = sorted(set(own) - set(fitting))
    notes = [f"weights: loaded {len(fitting)} tensors from {path}"]
    if skipped:
        notes.append(f"weights: kept initial values for {len(skipped)} tensors "
                     f"({', '.join(skipped[:4])}{', ...' if len(skipped) > 4 else ''})")
    return notes
