"""The model inside a wrapper: DDP (and Ray Train's ``prepare_model``) hold the user's module as ``.module``."""

from __future__ import annotations

from torch import nn


def unwrap_model(model: nn.Module) -> nn.Module:
    """``model.module`` for a DDP-style wrapper, else ``model`` itself."""
    return model.module if hasattr(model, "module") else model
