"""The FedFR site (seed 001): a Flower ``NumPyClient`` of the same family as ``FedReIDClient``.

One round (``fit``): check the manifest and the public identities, start from the site model of
its state (W_l, Pi, Omega, b and last round's Theta_l), take Theta_g^t and Phi_g^t from the
server, select this round's public hard negatives with the global model, train E local epochs of
``a1 L_cos + a2 L_con + a3 L_BCE``, save the state atomically, and return ONLY Theta_l and Phi
(the manifest: ``backbone.*`` and ``public_proxies``, packed into one array both ways,
``common/params.py``) with the site's own image count as weight (Eq. 2/4: public hard negatives
are not counted).

A per-message ClientApp builds the site model, Theta_g^t, Theta_l^{t-1} and the training loader in
every round, from the state on disk. A site process (``settings.hold_state``) keeps them: the site
model (with W_l and the DFC layer), the global and previous-round backbones and the optimizer on
the site's device (``client/device_modules.py``; each round copies Theta_l^{t-1}, Theta_g^t and
Phi_g^t into them in place), and the loader, over the site's images and every public image (a
round picks its hard negatives by index), with persistent workers (``client/round_loader.py``).
Both train the same, bit for bit.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import numpy as np
import torch
from flwr.client import NumPyClient
from torch import nn
from torch.utils.data import DataLoader

from client.device_modules import DeviceModules, cpu_copy
from client.fedfr.site_evaluation import evaluate_site, site_models
from client.fedfr.state import FEDFR_STATE, FedFRSiteState
from client.fedfr.train import LocalTraining, imprint, round_hard_negatives, round_learning_rate, train_local
from client.held_state import HeldState
from client.manifest_check import check_manifest_hash
from client.round_loader import RoundLoader
from client.run_end import record_round
from client.site_settings import SiteSettings, resolve_device
from common.config.experiment import ExperimentConfig
from common.config.site import default_state_dir
from common.datasets.base import Record
from common.datasets.face_folder import FaceFolder, FaceSite
from common.datasets.face_images import FaceImages, face_transform
from common.evaluation.features import embed
from common.models.fedfr import FedFRModel, expected_fedfr_manifest, fedfr_model
from common.params import from_wire, get_shared, set_shared, to_wire
from common.seeding import seed_everything, stable_seed

log = logging.getLogger("fedclient")


class FedFRClient(NumPyClient):
    def __init__(self, cfg: ExperimentConfig, settings: SiteSettings, public_root: str = ""):
        self.cfg = cfg
        self.f = cfg.fedfr
        self.s = settings
        if settings.site not in cfg.sites:
            raise ValueError(f"site {settings.site!r} is not part of this run (configured sites: {cfg.sites})")
        if settings.reader != "face_site":
            raise ValueError(
                f"site {settings.site}: FedFR reads a face_site folder (train/ and test/ identity "
                f"folders), but the site's reader is {settings.reader!r}; set reader: face_site"
            )
        self.device = resolve_device(settings.device)
        self.data = FaceSite(settings.data_root)
        # the site's own copy (the coordinator's fedfr.public_root is not in the site view); a full
        # config (tests, the coordinator's own evaluation) may still name it
        root = public_root or self.f.public_root
        if not root:
            raise ValueError(
                f"site {settings.site}: no public data; set the site's public_root (fedclient "
                f"--public-root DIR, or public_root in conf/site/{settings.site}.yaml)"
            )
        self.public = FaceFolder(root)
        self.manifest = expected_fedfr_manifest(self.f, self.public.num_identities)
        self.state_dir = Path(settings.state_dir or default_state_dir(settings.site)).expanduser()
        self._held = HeldState(background=settings.hold_state)
        # site model, Theta_g, Theta_l^{t-1}; a per-message site reuses built modules (client/module_pool.py)
        pool_key = (repr(cfg), self.public.num_identities, self.data.num_identities)
        self._kept = DeviceModules(self.device, hold=settings.hold_state, pool_key=pool_key)
        self._train_loader: RoundLoader | None = None  # a site process's, with persistent workers
        self._impostors: list[list[Record]] | None = None  # the evaluation's non-mated probes, read once

    def close(self) -> None:
        """Wait for the last state write and stop the loader's workers (a site process ending)."""
        try:
            self._held.flush()
        finally:
            if self._train_loader is not None:
                self._train_loader.close()
            self._kept.close()

    def get_properties(self, config):
        """The coordinator asks every new node for its site name (server/sites.py)."""
        return {"site": self.s.site}

    def get_parameters(self, config):
        torch.manual_seed(self.cfg.seed)
        return to_wire(self.manifest, get_shared(self._model(), self.manifest))

    def _model(self) -> FedFRModel:
        return fedfr_model(self.f, self.public.num_identities, self.data.num_identities)

    def fit(self, parameters, config):
        t0 = time.perf_counter()
        rnd = int(config.get("server_round", 1))
        self._check(config)
        parameters = from_wire(self.manifest, parameters, who=f"site {self.s.site}: the coordinator's parameters")
        if self.cfg.train.threads > 0:
            torch.set_num_threads(self.cfg.train.threads)
        seed_everything(stable_seed(self.cfg.seed, self.s.site, rnd))
        st = self._held.take(rnd) or FEDFR_STATE.load(
            self.state_dir,
            site=self.s.site,
            manifest_hash=self.manifest.hash,
            public_hash=self.public.identity_hash(),
            num_local=self.data.num_identities,
            before_round=rnd,
        )  # a round replayed after a coordinator resume
        ready = self._kept.start(st)  # a site process's modules, exactly where round st ended
        model, global_backbone, prev_backbone = self._round_models(st, parameters, ready=ready)
        hn = self._prepare_local(model, global_backbone, first=st is None or st.model is None)
        opt, lr = self._optimizer(model, st, rnd, ready=ready)
        loader, round_loader = self._loader(hn, rnd)
        # the training draws start from the round's seed, whatever building the models drew before
        seed_everything(stable_seed(self.cfg.seed, self.s.site, rnd, "train"))
        stats = train_local(
            model, global_backbone, prev_backbone, loader, opt, LocalTraining.from_config(self.f), device=self.device
        )
        round_loader.finished()
        model.zero_grad(set_to_none=True)  # a held model keeps no gradient between rounds
        stats["hard_negatives"] = float(hn.size)
        stats["lr"] = lr
        self._save(st, model, opt, hn, stats, rnd)
        return self._reply(model, stats, hn, rnd, time.perf_counter() - t0)

    def _round_models(self, st: FedFRSiteState | None, parameters: list[np.ndarray], *, ready: bool) -> tuple:
        """The site model (its state, then Theta_g^t and Phi_g^t), Theta_g^t, and Theta_l^{t-1} of L_con,
        on the device: new on a site's first round, else the held ones (a site process) or new ones,
        with the state's model loaded unless they are ``ready`` (already at ``st``)."""
        last = st.model if st is not None else None
        # W_l, Pi, Omega, b (and last round's Theta_l) from the state, unless the held model is at it
        model = self._kept.module("model", self._model, fresh=last is None, state=None if ready else last)
        prev_backbone = None
        if last is not None:
            prev_backbone = self._kept.copy_of("prev_backbone", model.backbone)  # Theta_l^{t-1}
        set_shared(model, self.manifest, parameters)  # Theta_g^t and Phi_g^t (Eq. 2, 4)
        global_backbone = self._kept.copy_of("global_backbone", model.backbone)
        if prev_backbone is None:
            prev_backbone = global_backbone  # a first round: the global model, not an untrained one
        return model, global_backbone, prev_backbone

    def _prepare_local(self, model: FedFRModel, global_backbone: nn.Module, *, first: bool) -> np.ndarray:
        """Imprint W_l and Omega on a site's first round (``init_local``) and return this round's
        public hard negatives (indices into the public records), both with the global model Theta_g^t."""
        emb = {"image_size": self.f.image_size, "batch_size": self.cfg.eval.batch_size, "device": self.device}
        local_feats = None
        select = self.f.hard_negatives and self.f.public_negatives == "hard"
        if select or (first and self.f.init_local == "imprint"):
            local_feats = embed(global_backbone, self.data.train, **emb)  # with Theta_g^t
        if first and self.f.init_local == "imprint":
            w = imprint(local_feats, np.array([r.pid for r in self.data.train]), self.data.num_identities)
            with torch.no_grad():
                model.local_proxies.copy_(w)
                model.dfc.omega.copy_(w)
        if self.f.hard_negatives and not select:  # "all": every public image, no selection
            return np.arange(len(self.public.records), dtype=np.int64)
        if select:
            return round_hard_negatives(
                global_backbone,
                self.public.records,
                local_feats,
                threshold=self.f.t_hn,
                chunk_size=self.f.hn_chunk,
                **emb,
            )
        return np.empty(0, np.int64)

    def _optimizer(
        self, model: FedFRModel, st: FedFRSiteState | None, rnd: int, *, ready: bool
    ) -> tuple[torch.optim.SGD, float]:
        """The round's SGD at the round's lr: a fresh SGD every round (paper, official code);
        ``fedfr.keep_optimizer_state``: last round's momentum (a site process's held optimizer, at
        ``st``, or loaded from ``st``)."""
        lr = round_learning_rate(self.f.lr, self.f.lr_milestones, self.f.lr_gamma, rnd)
        keep = self.f.keep_optimizer_state
        opt = self._kept.optimizer if ready and keep else None
        if opt is None:
            opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=self.f.momentum, weight_decay=self.f.weight_decay)
            if keep and st is not None and st.optimizer is not None:
                opt.load_state_dict(st.optimizer)  # momentum buffers; it also brings back last round's lr
        for group in opt.param_groups:
            group["lr"] = lr
        return opt, lr

    def _save(self, st, model: FedFRModel, opt, hn: np.ndarray, stats: dict, rnd: int) -> None:
        """The site state after round ``rnd`` (written now, or in the background by a site process)."""
        new = FedFRSiteState(
            site=self.s.site,
            manifest_hash=self.manifest.hash,
            public_hash=self.public.identity_hash(),
            num_local=self.data.num_identities,
            last_round=rnd,
            rounds_trained=(st.rounds_trained if st else 0) + 1,
            model=self._kept.snapshot(model.state_dict()),  # a copy now if the held model trains on
            hard_negatives=hn,
            optimizer=cpu_copy(opt.state_dict()) if self.f.keep_optimizer_state else None,
            history=(st.history if st else []) + [{"round": rnd, **stats}],
        )
        self._held.keep(new, lambda: FEDFR_STATE.save(self.state_dir, new))
        self._kept.finish(new, opt if self.f.keep_optimizer_state else None)
        record_round(self.state_dir, rnd, self.cfg.rounds)  # fedclient's exit status (client/run_end.py)

    def _reply(self, model: FedFRModel, stats: dict, hn: np.ndarray, rnd: int, seconds: float):
        """Theta_l and Phi, the weight N_i of Eq. (2)/(4) (the site's own images only), and the metrics."""
        log.info(
            "site %s round %d: %d own images + %d public hard negatives; %s (%.1fs)",
            self.s.site,
            rnd,
            len(self.data.train),
            hn.size,
            ", ".join(f"{k}={v:.4f}" for k, v in stats.items()),
            seconds,
        )
        own = len(self.data.train)
        metrics = {
            "site": self.s.site,
            "own_images": own,
            "train_seconds": seconds,
            **{k: float(v) for k, v in stats.items() if np.isfinite(v)},
        }
        return to_wire(self.manifest, get_shared(model, self.manifest, copy=False)), own, metrics  # one copy

    def evaluate(self, parameters, config):
        """Personalised evaluation where the data is (``client/fedfr/site_evaluation.py``): the global
        model sent, and the site's Theta_l and [Theta_l, Pi_l] of its last state; metrics only."""
        self._check(config)
        parameters = from_wire(self.manifest, parameters, who=f"site {self.s.site}: the coordinator's parameters")
        if self.cfg.train.threads > 0:
            torch.set_num_threads(self.cfg.train.threads)
        self._held.flush()  # the last round's state is on disk
        st = FEDFR_STATE.load(
            self.state_dir,
            site=self.s.site,
            manifest_hash=self.manifest.hash,
            public_hash=self.public.identity_hash(),
            num_local=self.data.num_identities,
        )
        global_model = fedfr_model(self.f, self.public.num_identities, 0)
        set_shared(global_model, self.manifest, parameters)
        site_model = None
        if st is not None and st.model is not None:
            site_model = self._model()
            site_model.load_state_dict(st.model)
        models = site_models(global_model, site_model)
        metrics = evaluate_site(self.cfg, self.s.site, self.data, self.impostors(), models, self.device)
        log.info("site %s: personalised evaluation of %s", self.s.site, ", ".join(models))
        return 0.0, len(self.data.test), {"site": self.s.site, **metrics}

    def impostors(self) -> list[list[Record]]:
        """The non-mated probes: the test images of the sites named by ``impostor_roots`` (in that
        order), else every public image."""
        if self._impostors is None:
            roots = [r for r in self.s.impostor_roots.split(os.pathsep) if r]
            self._impostors = [FaceSite(r).test for r in roots] or [list(self.public.records)]
        return self._impostors

    def _check(self, config) -> None:
        f = self.f
        model = (
            f"{f.backbone}, d={f.embedding_dim}, {f.image_size}px, K_g={self.public.num_identities} public identities"
        )
        check_manifest_hash(config, self.manifest, site=self.s.site, model=model)
        public_hash = str(config.get("public_hash", ""))
        if public_hash and public_hash != self.public.identity_hash():
            raise ValueError(
                f"site {self.s.site}: the public identities under {self.public.root} differ from those the "
                "generic model was pre-trained on (Phi_g rows would name other people); use the same public data"
            )

    def _loader(self, hard_negatives: np.ndarray, rnd: int) -> tuple[DataLoader, RoundLoader]:
        """Local images (labels 0..K_l-1) and this round's public hard negatives (public labels), and
        the loader's holder: its dataset is every local and public image, the round's indices pick."""
        held = self._train_loader
        if held is None:
            local, public = list(self.data.train), list(self.public.records)
            ds = FaceImages(
                local + public,
                face_transform(self.f.image_size, train=True, flip=self.f.flip),
                [False] * len(local) + [True] * len(public),
            )
            held = RoundLoader(
                ds, batch_size=self.f.batch_size, num_workers=self.cfg.train.num_workers, persistent=self.s.hold_state
            )
        if self.s.hold_state:
            self._train_loader = held
        own = len(self.data.train)
        indices = list(range(own)) + [own + int(i) for i in hard_negatives]
        seed = stable_seed(self.cfg.seed, self.s.site, rnd, "loader")
        return held.round(seed, indices, drop_last=len(indices) > self.f.batch_size), held
