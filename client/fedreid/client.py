"""The FedReID site: a Flower ``NumPyClient`` holding the private data, head and local expert.

One round (``fit``): check the manifest, take the embedding from the server and the head from
the site state (Eq. 7), start the local expert from this site's model at the end of its previous
round (Eq. 10), train t_max (Eq. 3, 9-13), save the state atomically and return ONLY the shared
tensors (the embedding; nothing of the head ever leaves the site), packed into one array both
ways (``common/params.py``).

A per-message ClientApp builds the model, the expert and the training loader in every round, from
the state on disk (a model with a state to take is built straight into its tensors, without its
random initialisation: ``common/models/from_state.py``). A site process (``settings.hold_state``)
keeps them: the model with its head, the expert and the optimizer on the site's device
(``client/device_modules.py``; each round copies the server's embedding into the model and the
model into the expert, in place), and the loader with persistent workers
(``client/round_loader.py``). Both train the same, bit for bit.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from pathlib import Path

import numpy as np
import torch
from flwr.client import NumPyClient
from torch.utils.data import DataLoader

from client.device_modules import DeviceModules, cpu_copy
from client.faults import parse_fault
from client.fedreid.state import FEDREID_STATE, FedReIDSiteState
from client.fedreid.train import make_optimizer, set_round_lr, train_round
from client.held_state import HeldState
from client.manifest_check import check_manifest_hash
from client.round_loader import RoundLoader
from client.run_end import record_round
from client.site_settings import SiteSettings, resolve_device
from common.config.experiment import ExperimentConfig
from common.config.modes import mode_of
from common.config.site import default_state_dir
from common.datasets import build_reader
from common.datasets.image_dataset import ImageDataset
from common.datasets.transforms import train_transform
from common.models.builder import expected_manifest, model_for
from common.models.reid import ReIDModel
from common.params import from_wire, get_shared, set_shared, to_wire
from common.processes import process_age_s
from common.seeding import seed_everything, stable_seed

log = logging.getLogger("fedclient")


class FedReIDClient(NumPyClient):
    def __init__(self, cfg: ExperimentConfig, settings: SiteSettings):
        self.cfg = cfg
        self.s = settings
        if settings.site not in cfg.sites:
            raise ValueError(f"site {settings.site!r} is not part of this run (configured sites: {cfg.sites})")
        self.device = resolve_device(settings.device)
        self.manifest = expected_manifest(cfg)
        self._shared = frozenset(self.manifest.keys)
        self.data = build_reader(settings.reader, settings.data_root)
        self.num_classes = self.data.splits.num_train_pids
        self.state_dir = Path(settings.state_dir or default_state_dir(settings.site)).expanduser()
        self.fault = parse_fault(settings.fault)
        self.mode = mode_of(cfg.strategy.mode)
        self._held = HeldState(background=settings.hold_state)
        # model, expert, optimizer; a per-message site reuses built modules of its build (client/module_pool.py)
        self._kept = DeviceModules(self.device, hold=settings.hold_state, pool_key=(repr(cfg), self.num_classes))
        self._train_loader: RoundLoader | None = None  # a site process's, with persistent workers

    def close(self) -> None:
        """Wait for the last state write and stop the loader's workers (a site process ending)."""
        try:
            self._held.flush()
        finally:
            if self._train_loader is not None:
                self._train_loader.close()
            self._kept.close()

    def get_properties(self, config):
        """Who this site is (the coordinator names every new node by it, server/sites.py) and how many
        training identities it has (the census of a common-head baseline, server/fedreid/fedavg_strategy.py;
        nothing else about its data)."""
        return {"site": self.s.site, "num_identities": int(self.num_classes)}

    def get_parameters(self, config):
        torch.manual_seed(self.cfg.seed)
        return to_wire(self.manifest, get_shared(model_for(self.cfg, self.num_classes), self.manifest))

    def fit(self, parameters, config):
        t0 = time.perf_counter()
        # ClientApp process start -> here (imports, data listing); a site process was up before the message
        startup = 0.0 if self.s.hold_state else process_age_s()
        server_round = int(config.get("server_round", 1))
        model = f"{self.cfg.model.backbone}, mode {self.cfg.strategy.mode}"
        check_manifest_hash(config, self.manifest, site=self.s.site, model=model)
        parameters = from_wire(self.manifest, parameters, who=f"site {self.s.site}: the coordinator's parameters")
        log.info("site %s round %d: local training starts", self.s.site, server_round)
        if self.fault is not None:
            self.fault.before_training(self.s.site, server_round)
        if self.cfg.train.threads > 0:
            torch.set_num_threads(self.cfg.train.threads)
        seed_everything(stable_seed(self.cfg.seed, self.s.site, server_round))
        # the newest state from BEFORE this round: after a coordinator resume, round k+1 may be asked again
        st = self._held.take(server_round) or FEDREID_STATE.load(
            self.state_dir,
            site=self.s.site,
            manifest_hash=self.manifest.hash,
            num_classes=self.num_classes,
            before_round=server_round,
        )
        ready = self._kept.start(st)  # a site process's modules, exactly where round st ended
        model, expert = self._round_models(st, parameters, ready=ready)
        opt, eopt = self._optimizers(model, expert, st, server_round, ready=ready)
        loader, round_loader = self._loader(server_round)
        t_load, cpu_load = time.perf_counter(), time.process_time()
        # the training draws start from the round's seed, whatever building the models drew before
        seed_everything(stable_seed(self.cfg.seed, self.s.site, server_round, "train"))
        stats = train_round(
            model,
            expert,
            loader,
            opt,
            eopt,
            unit=self.cfg.train.unit,
            iters=self.cfg.train.local_iters,
            temperature=self.cfg.train.temperature,
            device=self.device,
            max_steps_per_epoch=self.cfg.train.max_steps_per_epoch,
            label_offset=self._label_offset(config),
        )
        round_loader.finished()
        t_train, cpu_train = time.perf_counter(), time.process_time()
        for m in (model, expert):
            if m is not None:
                m.zero_grad(set_to_none=True)  # a held module keeps no gradient between rounds
        new = FedReIDSiteState(
            site=self.s.site,
            manifest_hash=self.manifest.hash,
            num_classes=self.num_classes,
            last_round=server_round,
            rounds_trained=(st.rounds_trained if st else 0) + 1,
            model=self._kept.snapshot(self._kept_tensors(model)),  # a copy now if the held model trains on
            optimizer=cpu_copy(opt.state_dict()) if self.cfg.train.keep_optimizer_state else None,
            history=(st.history if st else []) + [{"round": server_round, **stats}],
        )
        self._held.keep(new, lambda: FEDREID_STATE.save(self.state_dir, new))
        self._kept.finish(new, opt if self.cfg.train.keep_optimizer_state else None)
        record_round(self.state_dir, server_round, self.cfg.rounds)  # fedclient's exit status (client/run_end.py)
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
            # replaces it with its own in a site process, client/forward.py)
            "clientapp_seconds": process_age_s(),
        }
        log.info(
            "site %s round %d: %s | %s",
            self.s.site,
            server_round,
            ", ".join(f"{k}={v:.4f}" for k, v in stats.items()),
            ", ".join(f"{k}={v:.1f}" for k, v in timing.items()),
        )
        metrics = {"site": self.s.site, **timing, **{k: float(v) for k, v in stats.items()}}
        if self.fault is not None:
            update = get_shared(model, self.manifest)
            return [self.fault.wire(self.s.site, server_round, self.manifest, update)], len(self.data.train), metrics
        # packed straight from the model's tensors: the one copy of the update is the message's
        return to_wire(self.manifest, get_shared(model, self.manifest, copy=False)), len(self.data.train), metrics

    def _round_models(
        self, st: FedReIDSiteState | None, parameters: list[np.ndarray], *, ready: bool
    ) -> tuple[ReIDModel, ReIDModel | None]:
        """The round's model (own head, the server's embedding: Eq. 7) and local expert (Eq. 10), on the device.

        Built anew on a site's first round (no state), else the held ones (a site process) or new
        ones, with the state's model loaded into them unless they are ``ready`` (already at ``st``).
        """
        last = st.model if st is not None else None  # this site's model at the end of its previous round
        whole = last is None or all(k in last for k in self.manifest.keys)
        if not whole:  # saved without the shared tensors (_kept_tensors): the server's complete it
            if self._keeps_whole_model():  # a run whose next rounds did not read them wrote this state
                log.warning(
                    "site %s: the saved state holds no embedding (it was saved by a run that did not need "
                    "it: no local expert, no start_mix); this round's expert and start point take the "
                    "server's embedding in its place, as in a first round",
                    self.s.site,
                )
            last = self._with_shared(last, parameters)
        build = functools.partial(model_for, self.cfg, self.num_classes)
        # Eq. (7): own head (and own integer buffers) from the state, unless the held model is at it
        model = self._kept.module("model", build, fresh=last is None, state=None if ready else last)
        expert = None
        if self.mode.expert and self.cfg.train.local_expert:  # never in plain fedavg / local (common/config/modes.py)
            # Eq. (10): the model at the end of the previous round (copied in place into a held expert)
            expert = self._kept.module("expert", build, fresh=last is None, state=last)
        self._set_start_point(model, parameters, last)
        if expert is not None and last is None:  # a site's first round: the model it starts from
            expert.load_state_dict(model.state_dict())
        return model, expert

    def _keeps_whole_model(self) -> bool:
        """Whether a next round reads this round's whole model from the state: the local expert
        (Eq. 10), ``train.start_mix``, or a mode in which a site trains its own embedding on."""
        t = self.cfg.train
        return (self.mode.expert and t.local_expert) or t.start_mix > 0 or self.mode.own_embedding

    def _kept_tensors(self, model: ReIDModel) -> dict:
        """What the state keeps of the model: all of it, or (:meth:`_keeps_whole_model` false) only the
        tensors the server does not send (the own head, Eq. 7): the next round starts from the
        server's shared tensors in any case, and the state file shrinks from the model's size to the
        head's (a ResNet-18 with its default head: 46 MB to 1 MB written every round)."""
        state = model.state_dict()
        if self._keeps_whole_model():
            return state
        own = type(state)((k, v) for k, v in state.items() if k not in self._shared)
        own._metadata = getattr(state, "_metadata", None)  # noqa: SLF001 -- the module versions load_state_dict reads
        return own

    def _with_shared(self, own: dict, parameters: list[np.ndarray]) -> dict:
        """A state saved without the shared tensors, completed with the server's (the round's start, Eq. 7)."""
        full = type(own)(
            (k, torch.from_numpy(a if a.flags.writeable else a.copy())) for k, a in zip(self.manifest.keys, parameters)
        )
        full.update(own)
        full._metadata = getattr(own, "_metadata", None)  # noqa: SLF001
        return full

    def _set_start_point(self, model: ReIDModel, parameters: list[np.ndarray], last: dict | None) -> None:
        """Eq. (7)/(15): the embedding from the server; ``local`` mode keeps its own after round 1.
        ``last``: this site's model at the end of its previous round (None: a first round)."""
        if self.mode.own_embedding and last is not None:
            return
        set_shared(model, self.manifest, parameters)
        a = self.cfg.train.start_mix
        if a > 0 and last is not None:
            # public re-implementation's option: (1-a) * server + a * previous local
            state = model.state_dict()
            with torch.no_grad():
                for k in self.manifest.keys:
                    state[k].mul_(1 - a).add_(last[k].to(state[k].device), alpha=a)

    def _label_offset(self, config) -> int:
        """Common head (fedavg): this site's identity j is logit offset + j, the offset sent by the
        coordinator from the sites' own counts (server/fedreid/fedavg_strategy.py); 0 for an own head."""
        if not self.mode.common_head:
            return 0
        offsets = json.loads(str(config.get("label_offsets", "{}")))
        if self.s.site not in offsets:
            raise ValueError(
                f"site {self.s.site}: mode {self.cfg.strategy.mode} needs its label offset in the fit "
                f"config (label_offsets), found {sorted(offsets)}"
            )
        offset = int(offsets[self.s.site])
        if offset + self.num_classes > self.cfg.strategy.fedavg_num_classes:
            raise ValueError(
                f"site {self.s.site}: identities {offset}..{offset + self.num_classes - 1} do not fit "
                f"the common head of strategy.fedavg_num_classes={self.cfg.strategy.fedavg_num_classes}"
            )
        return offset

    def _optimizers(self, model, expert, st, server_round, *, ready: bool):
        t = self.cfg.train
        kw = {
            "lr_embedding": t.lr_embedding,
            "lr_head": t.lr_head,
            "momentum": t.momentum,
            "nesterov": t.nesterov,
            "weight_decay": t.weight_decay,
        }
        # the expert restarts every round from the model (Eq. 10): its optimizer starts afresh too
        eopt = make_optimizer(expert, **kw) if expert is not None else None
        # a fresh SGD every round (both papers' public codes); train.keep_optimizer_state: last round's
        # momentum (a site process's held optimizer, at st, or loaded from st)
        opt = self._kept.optimizer if ready and t.keep_optimizer_state else None
        if opt is None:
            opt = make_optimizer(model, **kw)
            if t.keep_optimizer_state and st is not None and st.optimizer is not None:
                opt.load_state_dict(st.optimizer)
        for o in (opt, eopt):
            if o is not None:
                set_round_lr(o, server_round, t.lr_step_rounds, t.lr_gamma)
        return opt, eopt

    def _loader(self, server_round: int) -> tuple[DataLoader, RoundLoader]:
        """The round's loader (two views of every training image), and its holder."""
        t, m = self.cfg.train, self.cfg.model
        train = self.data.train
        if len(train) < t.batch_size:
            raise ValueError(
                f"site {self.s.site}: {len(train)} training images is fewer than one batch ({t.batch_size})"
            )
        held = self._train_loader or RoundLoader(
            ImageDataset(train, train_transform(m.height, m.width), views=2),
            batch_size=t.batch_size,
            num_workers=t.num_workers,
            persistent=self.s.hold_state,
        )
        if self.s.hold_state:
            self._train_loader = held
        seed = stable_seed(self.cfg.seed, self.s.site, server_round, "loader")
        return held.round(seed, range(len(train)), drop_last=True), held
