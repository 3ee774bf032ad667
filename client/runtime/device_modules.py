"""The modules of a site's rounds on its device, kept between rounds by a site process, and their CPU copy.

A per-message ClientApp (``hold=False``) builds every module in every round and loads it from the
state on disk. A site process (``hold=True``) keeps them on its device: a module is built once, and
each round only copies into it what changes (the server's shared tensors, Eq. 7; the previous
round's model into the expert, Eq. 10). The same code runs both ways: "reuse the module if I have
one, else build it".

Whether a held module can be used as it is follows the state record the round starts from
(``client/runtime/held_state.py``): :meth:`DeviceModules.start` is true only when that record is the very
one :meth:`DeviceModules.finish` was given at the end of the last round, i.e. the modules are
exactly where that round left them. Otherwise (the process's first round with a saved state, a
round asked again after a coordinator resume, a round after one that failed half-way and left
half-trained weights behind) the caller loads the record's tensors into the held modules.

What is written to disk is :func:`cpu_copy` of their state dicts, taken synchronously at the
end of the round: the same keys and values, CPU tensors, as the modules' own state dicts.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import torch
from torch import nn

from client.runtime.module_pool import POOL, Pooled, poolable
from common.models.from_state import module_from_state

M = TypeVar("M", bound=nn.Module)


class DeviceModules:
    def __init__(self, device: torch.device, *, hold: bool, pool_key: Hashable | None = None) -> None:
        """``pool_key`` (per-message sites): what determines the modules' build (the run's config, the
        head's size); with one, modules are reused across the rounds of this process's sites
        (``client/runtime/module_pool.py``)."""
        self.device = device
        self.hold = hold
        self.pool_key = None if hold else pool_key
        self._borrowed: list[tuple[Hashable, Pooled]] = []  # this round's pooled modules, given back at finish
        self._modules: dict[str, nn.Module] = {}
        self._at: Any = None  # the state record the held modules are at (None: unknown)
        self.optimizer: torch.optim.Optimizer | None = None  # the held model's, at ``_at`` (only when kept)

    def start(self, state: Any) -> bool:
        """A round starts from ``state``: True if the held modules are at it (nothing to load).

        Taken, not kept: until :meth:`finish`, the modules count as half-trained.
        """
        at, self._at = self._at, None
        self._borrowed.clear()  # a round that failed half-way gives its modules back to no one
        return self.hold and state is not None and at is state

    def module(self, name: str, build: Callable[[], M], *, fresh: bool, state: dict | None = None) -> M:
        """The module ``name`` on the device: the held one, or (``fresh``, none held, not holding)
        a new one from ``build()``, held from now on by a site process.

        ``state``: the tensors the module is to have. A held module loads them; a new one is built
        straight into them, without drawing its own initialisation (``common/models/from_state.py``)."""
        if self.pool_key is not None:
            return self._pooled_module(name, build, state)
        m = self._modules.get(name) if self.hold else None
        if m is None or fresh:
            m = build().to(self.device) if state is None else module_from_state(build, state, self.device)
            if self.hold:
                self._modules[name] = m
        elif state is not None:
            m.load_state_dict(state)
        return m

    def _pooled_module(self, name: str, build: Callable[[], M], state: dict | None) -> M:
        """A per-message site's module: a pooled one with ``state`` loaded into it, or a new one.
        A module with no state to take is always built anew (its initialisation draws are the round's)."""
        key = (self.pool_key, name, str(self.device))
        pooled = POOL.take(key) if state is not None else None
        if pooled is not None:
            m = pooled.reset()
            m.load_state_dict(state)  # strict: every tensor (poolable() checked it at the build)
        else:
            m = build().to(self.device) if state is None else module_from_state(build, state, self.device)
            if not poolable(m):
                return m
            pooled = Pooled(m)  # its modes now: a new module's
        self._borrowed.append((key, pooled))
        return m

    def copy_of(self, name: str, source: nn.Module) -> nn.Module:
        """A module equal to ``source`` (tensors and all): the held one with ``source`` copied into it
        in place, or a new deep copy, held from now on by a site process."""
        if self.pool_key is not None:
            key = (self.pool_key, name, str(self.device))
            pooled = POOL.take(key)
            if pooled is not None:
                m = pooled.reset()
                m.load_state_dict(source.state_dict())
                for dst, src in zip(m.modules(), source.modules(), strict=True):  # deepcopy's modes
                    dst.training = src.training
                for dst, src in zip(m.parameters(), source.parameters(), strict=True):
                    dst.requires_grad_(src.requires_grad)
            else:
                m = copy.deepcopy(source)
                if not poolable(m):
                    return m
                pooled = Pooled(m)
            self._borrowed.append((key, pooled))
            return m
        m = self._modules.get(name) if self.hold else None
        if m is None:
            m = copy.deepcopy(source)
            if self.hold:
                self._modules[name] = m
        else:
            m.load_state_dict(source.state_dict())
        return m

    def finish(self, state: Any, optimizer: torch.optim.Optimizer | None = None) -> None:
        """The round ended and ``state`` (its record, kept by ``HeldState``) is where the modules are.

        A per-message site's pooled modules go back to the pool: the round may still read them
        (its reply) until it returns; only a later round of this thread takes them."""
        if self.hold:
            self._at, self.optimizer = state, optimizer
        for key, pooled in self._borrowed:  # the next round of any site of this process may reuse them
            POOL.give(key, pooled)
        self._borrowed.clear()

    def snapshot(self, state_dict: dict) -> dict:
        """What the round's state record holds of a module's state dict: a CPU copy, taken now, when
        a site process holds the module (it writes the record in the background while the next round
        trains the module) or the module is not on the CPU; otherwise the state dict itself: a
        per-message site writes its record before :meth:`finish` gives its modules back to the pool
        (``client/runtime/held_state.py``), and a pooled module is only reused by a later round."""
        if self.hold:
            return cpu_copy(state_dict)
        if any(isinstance(v, torch.Tensor) and v.device.type != "cpu" for v in state_dict.values()):
            return cpu_copy(state_dict)
        return state_dict

    def close(self) -> None:
        self._modules.clear()
        self._at, self.optimizer = None, None


def cpu_copy(obj: Any) -> Any:
    """A copy of a state dict (nested dicts, lists, tuples of tensors and plain values) with every
    tensor copied to the CPU; a dict keeps its class and attributes (a module state dict's ``_metadata``)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        out = copy.copy(obj)
        for k, v in obj.items():
            out[k] = cpu_copy(v)
        return out
    if isinstance(obj, list | tuple):
        return type(obj)(cpu_copy(v) for v in obj)
    return copy.deepcopy(obj)
