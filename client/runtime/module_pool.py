"""Built modules, reused from one round to the next by the per-message sites of one process.

A Ray worker of the simulation engine trains a round of one virtual site, then of another
(``client/flower/virtual_site.py``): each round builds its model (and expert, and FedFR's backbone copies)
and then overwrites every tensor with the site's state (``common/models/from_state.py``). Building
a model's Python modules is a cost paid again per module and round. A round that ends
gives its modules back here (``client/runtime/device_modules.py``); the next round that needs a module of
the same build (key: the run's config, the head's size, the name and the device) takes it and
loads its state into it: every parameter and buffer is overwritten (strictly: a module is pooled
only if its state dict holds every tensor it has), and what else a round may have changed is set
back to what a new module would have: each submodule's train/eval mode and each parameter's
``requires_grad`` as they were when the module was built, and no gradient.

Per thread (one thread of a process never runs two rounds at once, so a module is never used by
two rounds), a few modules (:data:`POOL_SIZE`, the least recently given back dropped first). A
round that fails gives nothing back: its modules, half-trained, are simply dropped.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

from torch import nn

POOL_SIZE = 6  # modules kept per thread: a model and an expert for each of a few head sizes


class Pooled:
    """A module and the modes it had when it was built (what a reuse sets back)."""

    __slots__ = ("module", "requires_grad", "training")

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.training = [m.training for m in module.modules()]
        self.requires_grad = [p.requires_grad for p in module.parameters()]

    def reset(self) -> nn.Module:
        """The module with its build-time modes and no gradients (its tensors: the caller loads them)."""
        for m, t in zip(self.module.modules(), self.training, strict=True):
            m.training = t
        for p, r in zip(self.module.parameters(), self.requires_grad, strict=True):
            p.requires_grad_(r)
            p.grad = None
        return self.module


def poolable(module: nn.Module) -> bool:
    """True if loading a state dict sets every tensor of ``module`` (no non-persistent buffer)."""
    keys = set(module.state_dict())
    return all(n in keys for n, _ in module.named_parameters(remove_duplicate=False)) and all(
        n in keys for n, _ in module.named_buffers(remove_duplicate=False)
    )


class ModulePool(threading.local):
    def __init__(self, size: int = POOL_SIZE) -> None:
        self.size = size
        self._free: OrderedDict[tuple[Hashable, int], Pooled] = OrderedDict()
        self._count = 0

    def take(self, key: Hashable) -> Pooled | None:
        """A module given back under ``key`` (now the caller's alone), or None."""
        for k in self._free:
            if k[0] == key:
                return self._free.pop(k)
        return None

    def give(self, key: Hashable, pooled: Pooled) -> None:
        """``pooled`` may be reused by the next round that asks for ``key``."""
        self._count += 1
        self._free[(key, self._count)] = pooled
        while len(self._free) > self.size:
            self._free.popitem(last=False)

    def clear(self) -> None:
        self._free.clear()

    def __len__(self) -> int:
        return len(self._free)


POOL = ModulePool()  # this process's (per thread)
