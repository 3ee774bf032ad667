"""A module built straight into a state dict's tensors, without its own random initialisation.

A per-message site (the simulation engine's virtual sites, ``fedclient --no-site-process``) builds
its model anew in every round and then overwrites every tensor with the site's state (its model at
the end of its previous round). The initialisation draws (torchvision's Kaiming init: most of a
ResNet's build time, per site and round) are thrown away. Built on the meta
device (shapes and dtypes only), materialised on the target device and loaded strictly, it is the
same module, tensor for tensor, and it draws nothing from torch's random streams (a round reseeds
before training in any case, so training is the same either way).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

import torch
from torch import nn

M = TypeVar("M", bound=nn.Module)


def module_from_state(build: Callable[[], M], state: Mapping[str, torch.Tensor], device: torch.device | str) -> M:
    """``build()`` on ``device`` with every tensor taken from ``state`` (``load_state_dict``, strict).

    A module with a tensor the state cannot give (a non-persistent buffer is in no state dict) is
    built and initialised as usual before the load, so nothing is ever left uninitialised.
    """
    with torch.device("meta"):
        module = build()
    keys = set(module.state_dict())
    tensors = {n for n, _ in module.named_parameters(remove_duplicate=False)}
    tensors |= {n for n, _ in module.named_buffers(remove_duplicate=False)}
    # every tensor comes from the state: allocate them uninitialised; else build (and draw) as usual
    module = module.to_empty(device=device) if tensors <= keys else build().to(device)
    module.load_state_dict(state)  # strict: a key missing or too many is an error, as for any state
    return module
