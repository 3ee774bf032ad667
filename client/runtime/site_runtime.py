"""How this process runs a site's rounds: the one interface between a task and the runtime.

A site runs in one of two ways, and a task's code never asks which:

- a long-lived site process (``client/process/site_process.py``; the site settings' ``hold_state``) keeps
  the state record of its last round in memory and writes its file in the background
  (``client/runtime/held_state.py``), keeps the round's modules and optimiser on its device
  (``client/runtime/device_modules.py``) and its training loader with persistent workers
  (``client/runtime/round_loader.py``);
- a per-message ClientApp (the simulation engine, ``fedclient --no-site-process``, unit tests)
  reads the state from disk every round, builds every module (reusing built modules of the same
  build across the rounds of this process's sites, ``client/runtime/module_pool.py``) and a new loader,
  and writes the state before it replies.

Both train the same, bit for bit. A round goes: :meth:`SiteRuntime.begin` (the state the round
starts from), :meth:`~SiteRuntime.module` / :meth:`~SiteRuntime.copy_of` /
:meth:`~SiteRuntime.optimizer` / :meth:`~SiteRuntime.loader`, the task's training,
:meth:`~SiteRuntime.trained`, then :meth:`~SiteRuntime.keep` with the round's state record.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from client.runtime.device_modules import DeviceModules, cpu_copy
from client.runtime.held_state import HeldState
from client.runtime.round_loader import RoundLoader
from client.runtime.settings import SiteSettings
from common.processes import process_age_s

M = TypeVar("M", bound=nn.Module)
S = TypeVar("S")


class SiteRuntime:
    def __init__(self, settings: SiteSettings, device: torch.device, *, build_key: Hashable) -> None:
        """``build_key``: what determines the build of the task's modules (the run's config, the
        heads' sizes); modules of one key are interchangeable once their tensors are loaded."""
        self.device = device
        self._site_process = settings.hold_state
        self._held = HeldState(background=self._site_process)
        self._modules = DeviceModules(device, hold=self._site_process, pool_key=build_key)
        self._kept_loader: RoundLoader | None = None  # a site process's, with persistent workers
        self._ready = False  # this round: the kept modules are where its start state left them
        self._round_modules: list[nn.Module] = []
        self._round_loader: RoundLoader | None = None
        self._carried: torch.optim.Optimizer | None = None

    def startup_seconds(self) -> float:
        """This process's start -> now, when it started for this message (imports, data listing);
        0 in a site process, which was up before the message."""
        return 0.0 if self._site_process else process_age_s()

    def begin(self, server_round: int, load: Callable[[], S | None]) -> S | None:
        """The state round ``server_round`` starts from: the one held in memory, else ``load()``
        (the newest saved state from before this round)."""
        st = self._held.take(server_round) or load()
        self._ready = self._modules.start(st)
        self._round_modules, self._round_loader, self._carried = [], None, None
        return st

    def module(self, name: str, build: Callable[[], M], *, at: dict | None, continues: bool = False) -> M:
        """The module ``name`` on the device with the tensors ``at`` (None: newly built by ``build()``,
        with its own initialisation).

        ``continues``: the module the site trains from round to round, ``at`` being where its last
        round left it: a site process's module that is still there is used as it is."""
        state = None if continues and self._ready else at
        m = self._modules.module(name, build, fresh=at is None, state=state)
        self._round_modules.append(m)
        return m

    def copy_of(self, name: str, source: nn.Module) -> nn.Module:
        """A module equal to ``source``, tensors and modes (a copy the round keeps as it is)."""
        m = self._modules.copy_of(name, source)
        self._round_modules.append(m)
        return m

    def optimizer(
        self, build: Callable[[], torch.optim.Optimizer], *, saved: dict | None, carried: bool
    ) -> torch.optim.Optimizer:
        """The round's optimiser: ``build()``, or with ``carried`` (its state goes on from round to
        round) the last round's: a site process's own when its modules are at the round's start,
        else ``build()`` loaded with ``saved``."""
        opt = self._modules.optimizer if carried and self._ready else None
        if opt is None:
            opt = build()
            if carried and saved is not None:
                opt.load_state_dict(saved)
        self._carried = opt if carried else None
        return opt

    def loader(
        self,
        dataset: Callable[[], Dataset],
        *,
        batch_size: int,
        num_workers: int,
        seed: int,
        indices: Sequence[int],
        drop_last: bool,
    ) -> DataLoader:
        """The round's training loader over ``indices`` of ``dataset()`` (every record the site may
        train on; built once by a site process), shuffled and augmented from ``seed`` alone."""
        held = self._kept_loader or RoundLoader(
            dataset(), batch_size=batch_size, num_workers=num_workers, persistent=self._site_process
        )
        if self._site_process:
            self._kept_loader = held
        self._round_loader = held
        return held.round(seed, indices, drop_last=drop_last)

    def trained(self) -> None:
        """The round's training ended normally: its loader is done and its modules drop their
        gradients (a kept or reused module carries none into another round)."""
        if self._round_loader is not None:
            self._round_loader.finished()
        for m in self._round_modules:
            m.zero_grad(set_to_none=True)

    def snapshot(self, state_dict: dict) -> dict:
        """What a state record holds of a module's state dict (a CPU copy when the module lives on)."""
        return self._modules.snapshot(state_dict)

    @staticmethod
    def optimizer_state(opt: torch.optim.Optimizer) -> dict[str, Any]:
        """What a state record holds of an optimiser: a CPU copy of its state dict."""
        return cpu_copy(opt.state_dict())

    def keep(self, state: Any, write: Callable[[], object]) -> None:
        """The round's state record: written by ``write()`` (now, or in the background by a site
        process that keeps it, with the round's modules and carried optimiser, for its next round)."""
        self._held.keep(state, write)
        self._modules.finish(state, self._carried)
        # the round's modules, loader and optimiser are no longer this site's: a site process's
        # DeviceModules holds what it keeps, a per-message site's modules went back to the pool, and
        # a virtual site that a Ray worker keeps between messages must not keep a model per site
        self._round_modules, self._round_loader, self._carried = [], None, None

    def flush(self) -> None:
        """Wait for the last state write: the state file is then the newest finished round."""
        self._held.flush()

    def close(self) -> None:
        """Wait for the last state write and stop the loader's workers (a site process ending)."""
        try:
            self._held.flush()
        finally:
            if self._kept_loader is not None:
                self._kept_loader.close()
            self._modules.close()
