"""``train.channels_last``: a site's local training with its convolutions in the channels-last layout.

Convolutions in NHWC order are faster on GPUs with tensor cores and on many CPUs (oneDNN). The values
are the same tensors; only the order in memory changes, and with it the order in which the kernels
sum: the results agree with the default (NCHW) layout to float rounding, not bit for bit (oneDNN's
CPU kernels included). The option is therefore off by default, so that runs stay bit-identical to
runs without it and to the figures measured without it.

While training, the given modules' 4-D tensors (convolution weights) and each batch are channels-last;
on leaving, the modules are back in the standard contiguous layout, so that what a site saves and
sends (its state, its update) is laid out as without the option.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn


def _same(x: torch.Tensor) -> torch.Tensor:
    return x


def _nhwc(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x


@contextlib.contextmanager
def channels_last(enabled: bool, *modules: nn.Module | None) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
    """Within the block ``modules`` (``None`` skipped) are channels-last when ``enabled``; yields what
    to apply to each input batch (the identity when not enabled)."""
    if not enabled:
        yield _same
        return
    present = [m for m in modules if m is not None]
    for m in present:
        m.to(memory_format=torch.channels_last)
    try:
        yield _nhwc
    finally:
        for m in present:
            m.to(memory_format=torch.contiguous_format)
