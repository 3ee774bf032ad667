"""The site skeleton: one Flower ``NumPyClient`` sequence that every task's site runs.

A round (``fit``): check the coordinator's manifest, unpack the shared tensors (one packed array,
``common/params.py``), seed from (run seed, site, round), take the state the round starts from,
build the round (the task), train it (the task) from the round's training seed, keep the new state
(written atomically; ``client/runtime/state.py``), record the round (``client/process/run_end.py``) and reply with
ONLY the shared tensors, the site's weight and its metrics. How this process holds the state, the
modules, the optimiser and the loader between rounds is the runtime's (``client/runtime/site_runtime.py``):
a task asks it for them and never learns which way the site runs.

A task subclasses :class:`SiteClient` and provides:

- ``store``: its state store (``client/<task>/state.py``), and ``manifest``, set in its ``__init__``
  after it has read its data;
- :meth:`build_key`, :meth:`state_identity`, :meth:`model_name`, :meth:`initial_model`,
  :meth:`num_examples`;
- :meth:`prepare_round` (the round's models, optimisers and loader, as an object with a ``model``),
  :meth:`train_round` (returns its statistics), :meth:`state_to_keep`, and :meth:`update` (what it
  shares; by default the manifest's tensors of the round's ``model``);
- optionally :meth:`reply_metrics`, :meth:`check`, ``get_properties``, and a site-side evaluation:
  ``evaluate`` defined as :meth:`evaluate_at_site` with a :meth:`score`.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Hashable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from flwr.client import NumPyClient
from torch import nn

from client.runtime.manifest_check import check_manifest_hash
from client.runtime.settings import SiteSettings, resolve_device
from client.runtime.site_runtime import SiteRuntime
from client.runtime.state import SiteStateStore
from common.config.experiment import ExperimentConfig
from common.config.site import default_state_dir
from common.params import Manifest, from_wire, get_shared, to_wire
from common.processes import process_age_s
from common.seeding import seed_everything, stable_seed

log = logging.getLogger("fedclient")


class RoundHooks:
    """What the process that holds a site adds around each of its rounds; by default nothing. The
    site process and the ClientApp attach theirs (``client/process/round_hooks.py``: the round
    record fedclient's exit status reads, and fault injection), so the skeleton imports neither."""

    def before_training(self, site: str, server_round: int) -> None:
        """Called once the coordinator's parameters are unpacked, before the round's training."""

    def after_round(self, state_dir: Path, server_round: int, rounds: int) -> None:
        """Called once the round's state is kept, before the reply is packed."""

    def reply(self, site: str, server_round: int, manifest: Manifest, update: list[np.ndarray]) -> np.ndarray | None:
        """The packed reply to send instead of the update's own packing; None: the update as it is."""
        return None


class SiteClient(NumPyClient):
    store: ClassVar[SiteStateStore]
    manifest: Manifest

    def __init__(self, cfg: ExperimentConfig, settings: SiteSettings) -> None:
        if settings.site not in cfg.sites:
            raise ValueError(f"site {settings.site!r} is not part of this run (configured sites: {cfg.sites})")
        self.cfg = cfg
        self.s = settings
        self.device = resolve_device(settings.device)
        self.state_dir = Path(settings.state_dir or default_state_dir(settings.site)).expanduser()
        self.hooks = RoundHooks()  # replaced by the process that holds the site (client/process/round_hooks.py)

    @functools.cached_property
    def runtime(self) -> SiteRuntime:
        """Made at its first use, once the task's ``__init__`` has read what its build depends on."""
        return SiteRuntime(self.s, self.device, build_key=self.build_key())

    # -- the task's hooks -------------------------------------------------------------------

    def build_key(self) -> Hashable:
        """What determines the build of the round's modules (the run's config, the heads' sizes)."""
        raise NotImplementedError

    def state_identity(self) -> dict[str, Any]:
        """The fields a loaded state must match (``store.checks``): this site, model and data."""
        raise NotImplementedError

    def model_name(self) -> str:
        """The model, as an error about a manifest that differs names it."""
        raise NotImplementedError

    def initial_model(self) -> nn.Module:
        """A new model (from the run's seed) whose shared tensors :meth:`get_parameters` sends."""
        raise NotImplementedError

    def num_examples(self) -> int:
        """The site's weight in the coordinator's average."""
        raise NotImplementedError

    def prepare_round(self, st: Any, parameters: list[np.ndarray], server_round: int, config: dict) -> Any:
        """The round's models (started from ``st`` and the coordinator's ``parameters``),
        optimisers and loader, asked of :attr:`runtime`: an object with the shared ``model``."""
        raise NotImplementedError

    def train_round(self, r: Any) -> dict[str, float]:
        """Train the round prepared by :meth:`prepare_round`; its statistics."""
        raise NotImplementedError

    def state_to_keep(self, st: Any, r: Any, stats: dict[str, float], server_round: int) -> Any:
        """The state record after round ``server_round`` (``st``: the one it started from)."""
        raise NotImplementedError

    def update(self, r: Any) -> list[np.ndarray]:
        """The tensors the site sends: the manifest's of the round's model (views, packed once)."""
        return get_shared(r.model, self.manifest, copy=False)

    def reply_metrics(self, stats: dict[str, float], timing: dict[str, float]) -> dict[str, Any]:
        """The reply's metrics: the site, the round's timings and its statistics."""
        return {"site": self.s.site, **timing, **{k: float(v) for k, v in stats.items()}}

    def score(self, parameters: list[np.ndarray], st: Any) -> tuple[int, dict[str, Any]]:
        """A site-side evaluation of the coordinator's ``parameters`` and the site's last state
        ``st``: (the number of examples, the metrics)."""
        raise NotImplementedError

    def check(self, config: dict) -> None:
        """Refuse an instruction for another model (the manifest hash in ``config``)."""
        check_manifest_hash(config, self.manifest, site=self.s.site, model=self.model_name())

    # -- the sequence -----------------------------------------------------------------------

    def round_seed(self, server_round: int, *tags: str) -> int:
        """The seed of (run seed, this site, the round, ``tags``)."""
        return stable_seed(self.cfg.seed, self.s.site, server_round, *tags)

    def load_state(self, before_round: int | None = None) -> Any:
        """The newest saved state of this site (from before ``before_round`` when given), or None."""
        return self.store.load(self.state_dir, before_round=before_round, **self.state_identity())

    def get_properties(self, config):
        """Who this site is: the coordinator names every new node by it (``server/strategy/sites.py``)."""
        return {"site": self.s.site}

    def get_parameters(self, config):
        torch.manual_seed(self.cfg.seed)
        return to_wire(self.manifest, get_shared(self.initial_model(), self.manifest))

    def close(self) -> None:
        """Wait for the last state write and stop the loader's workers (a site process ending)."""
        self.runtime.close()

    def _unpack(self, parameters: list[np.ndarray], config: dict) -> list[np.ndarray]:
        self.check(config)
        return from_wire(self.manifest, parameters, who=f"site {self.s.site}: the coordinator's parameters")

    def _set_threads(self) -> None:
        if self.cfg.train.threads > 0:
            torch.set_num_threads(self.cfg.train.threads)

    def fit(self, parameters, config):
        t0 = time.perf_counter()
        startup = self.runtime.startup_seconds()
        server_round = int(config.get("server_round", 1))
        parameters = self._unpack(parameters, config)
        log.info("site %s round %d: local training starts", self.s.site, server_round)
        self.hooks.before_training(self.s.site, server_round)
        self._set_threads()
        seed_everything(self.round_seed(server_round))
        # the newest state from BEFORE this round: after a coordinator resume, round k+1 may be asked again
        st = self.runtime.begin(server_round, lambda: self.load_state(before_round=server_round))
        r = self.prepare_round(st, parameters, server_round, config)
        t_load, cpu_load = time.perf_counter(), time.process_time()
        # the training draws start from the round's seed, whatever building the models drew before
        seed_everything(self.round_seed(server_round, "train"))
        stats = self.train_round(r)
        self.runtime.trained()
        t_train, cpu_train = time.perf_counter(), time.process_time()
        new = self.state_to_keep(st, r, stats, server_round)
        self.runtime.keep(new, lambda: self.store.save(self.state_dir, new))
        self.hooks.after_round(self.state_dir, server_round, self.cfg.rounds)
        t_end = time.perf_counter()
        timing = {
            "startup_seconds": startup,
            "load_seconds": t_load - t0,
            "train_seconds": t_train - t_load,
            # CPU seconds of this process's training (its threads; DataLoader workers not counted):
            # the work the cores had to do, whatever else shared them (benchmarks/sim_overhead.py)
            "train_cpu_seconds": cpu_train - cpu_load,
            "save_seconds": t_end - t_train,
            # the process's age at the reply (a per-message ClientApp: all of it; the forwarder
            # replaces it with its own in a site process, client/process/forward.py)
            "clientapp_seconds": process_age_s(),
        }
        log.info(
            "site %s round %d: %s | %s",
            self.s.site,
            server_round,
            ", ".join(f"{k}={v:.4f}" for k, v in stats.items()),
            ", ".join(f"{k}={v:.1f}" for k, v in timing.items()),
        )
        metrics = self.reply_metrics(stats, timing)
        update = self.update(r)
        if (packed := self.hooks.reply(self.s.site, server_round, self.manifest, update)) is not None:
            return [packed], self.num_examples(), metrics
        # packed straight from the model's tensors: the one copy of the update is the message's
        return to_wire(self.manifest, update), self.num_examples(), metrics

    def evaluate_at_site(self, parameters, config):
        """A task's ``evaluate``: :meth:`score` of the coordinator's model and the site's last saved
        state, where the data is; metrics only (no loss)."""
        parameters = self._unpack(parameters, config)
        self._set_threads()
        self.runtime.flush()  # the last round's state is on disk
        n, metrics = self.score(parameters, self.load_state())
        return 0.0, n, {"site": self.s.site, **metrics}
