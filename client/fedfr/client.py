"""The FedFR site (Liu et al., AAAI 2022): a Flower ``NumPyClient`` on the site skeleton of ``client/site.py``.

One round (``fit``): check the manifest and the public identities, start from the site model of
its state (W_l, Pi, Omega, b and last round's Theta_l), take Theta_g^t and Phi_g^t from the
server, select this round's public hard negatives with the global model, train E local epochs of
``a1 L_cos + a2 L_con + a3 L_BCE``, save the state atomically, and return ONLY Theta_l and Phi
(the manifest: ``backbone.*`` and ``public_proxies``, packed into one array both ways,
``common/params.py``) with the site's own image count as weight (Eq. 2/4: public hard negatives
are not counted).

The site model (with W_l and the DFC layer), the copies Theta_g^t and Theta_l^{t-1}, the optimiser
and the loader come from the site's runtime (``client/runtime/site_runtime.py``), which builds them or
keeps them between rounds. The loader's dataset is the site's images and every public image: a
round picks its hard negatives by index.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from client.fedfr.site_evaluation import evaluate_site, site_models
from client.fedfr.state import FEDFR_STATE, FedFRSiteState
from client.fedfr.train import LocalTraining, imprint, round_hard_negatives, round_learning_rate, train_local
from client.runtime.settings import SiteSettings
from client.site import SiteClient
from common.config.experiment import ExperimentConfig
from common.datasets.base import Record
from common.datasets.face_folder import FaceFolder, FaceSite
from common.datasets.face_images import FaceImages, face_transform
from common.evaluation.features import embed
from common.models.fedfr import FedFRModel, expected_fedfr_manifest, fedfr_model
from common.params import set_shared

log = logging.getLogger("fedclient")


@dataclass
class FedFRRound:
    """One round: the site model, Theta_g^t and Theta_l^{t-1} of L_con, the public hard negatives
    (indices into the public records), the SGD at the round's lr, and the loader."""

    model: FedFRModel
    global_backbone: nn.Module
    prev_backbone: nn.Module
    hard_negatives: np.ndarray
    opt: torch.optim.SGD
    lr: float
    loader: DataLoader


class FedFRClient(SiteClient):
    store = FEDFR_STATE

    def __init__(self, cfg: ExperimentConfig, settings: SiteSettings, public_root: str = ""):
        super().__init__(cfg, settings)
        self.f = cfg.fedfr
        if settings.reader != "face_site":
            raise ValueError(
                f"site {settings.site}: FedFR reads a face_site folder (train/ and test/ identity "
                f"folders), but the site's reader is {settings.reader!r}; set reader: face_site"
            )
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
        self._impostors: list[list[Record]] | None = None  # the evaluation's non-mated probes, read once

    def build_key(self):
        return (repr(self.cfg), self.public.num_identities, self.data.num_identities)

    def state_identity(self) -> dict:
        return {
            "site": self.s.site,
            "manifest_hash": self.manifest.hash,
            "public_hash": self.public.identity_hash(),
            "num_local": self.data.num_identities,
        }

    def model_name(self) -> str:
        f = self.f
        return (
            f"{f.backbone}, d={f.embedding_dim}, {f.image_size}px, K_g={self.public.num_identities} public identities"
        )

    def initial_model(self) -> FedFRModel:
        return fedfr_model(self.f, self.public.num_identities, self.data.num_identities)

    def num_examples(self) -> int:
        """N_i of Eq. (2)/(4): the site's own images only."""
        return len(self.data.train)

    def check(self, config) -> None:
        super().check(config)
        public_hash = str(config.get("public_hash", ""))
        if public_hash and public_hash != self.public.identity_hash():
            raise ValueError(
                f"site {self.s.site}: the public identities under {self.public.root} differ from those the "
                "generic model was pre-trained on (Phi_g rows would name other people); use the same public data"
            )

    def prepare_round(self, st, parameters, server_round, config) -> FedFRRound:
        model, global_backbone, prev_backbone = self._round_models(st, parameters)
        hn = self._prepare_local(model, global_backbone, first=st is None or st.model is None)
        opt, lr = self._optimizer(model, st, server_round)
        loader = self._loader(hn, server_round)
        return FedFRRound(model, global_backbone, prev_backbone, hn, opt, lr, loader)

    def train_round(self, r: FedFRRound) -> dict[str, float]:
        training = LocalTraining.from_config(self.f)
        stats = train_local(
            r.model,
            r.global_backbone,
            r.prev_backbone,
            r.loader,
            r.opt,
            training,
            device=self.device,
            use_channels_last=self.cfg.train.channels_last,
        )
        stats["hard_negatives"] = float(r.hard_negatives.size)
        stats["lr"] = r.lr
        return stats

    def state_to_keep(self, st, r: FedFRRound, stats, server_round) -> FedFRSiteState:
        return FedFRSiteState(
            site=self.s.site,
            manifest_hash=self.manifest.hash,
            public_hash=self.public.identity_hash(),
            num_local=self.data.num_identities,
            last_round=server_round,
            rounds_trained=(st.rounds_trained if st else 0) + 1,
            model=self.runtime.snapshot(r.model.state_dict()),
            hard_negatives=r.hard_negatives,
            optimizer=self.runtime.optimizer_state(r.opt) if self.f.keep_optimizer_state else None,
            history=(st.history if st else []) + [{"round": server_round, **stats}],
        )

    def reply_metrics(self, stats, timing) -> dict:
        """The weight N_i of Eq. (2)/(4) (the site's own images only), the round's seconds, its statistics."""
        return {
            "site": self.s.site,
            "own_images": len(self.data.train),
            "train_seconds": timing["load_seconds"] + timing["train_seconds"] + timing["save_seconds"],
            **{k: float(v) for k, v in stats.items() if np.isfinite(v)},
        }

    def evaluate(self, parameters, config):
        """Personalised evaluation where the data is (``client/fedfr/site_evaluation.py``): the global
        model sent, and the site's Theta_l and [Theta_l, Pi_l] of its last state; metrics only."""
        return self.evaluate_at_site(parameters, config)

    def score(self, parameters, st) -> tuple[int, dict]:
        global_model = fedfr_model(self.f, self.public.num_identities, 0)
        set_shared(global_model, self.manifest, parameters)
        site_model = None
        if st is not None and st.model is not None:
            site_model = self.initial_model()
            site_model.load_state_dict(st.model)
        models = site_models(global_model, site_model)
        metrics = evaluate_site(self.cfg, self.s.site, self.data, self.impostors(), models, self.device)
        log.info("site %s: personalised evaluation of %s", self.s.site, ", ".join(models))
        return len(self.data.test), metrics

    def _round_models(self, st: FedFRSiteState | None, parameters: list[np.ndarray]) -> tuple:
        """The site model (its state, then Theta_g^t and Phi_g^t), Theta_g^t, and Theta_l^{t-1} of L_con,
        on the device: new on a site's first round, else at the model of the state."""
        last = st.model if st is not None else None
        # W_l, Pi, Omega, b (and last round's Theta_l) from the state
        model = self.runtime.module("model", self.initial_model, at=last, continues=True)
        prev_backbone = None
        if last is not None:
            prev_backbone = self.runtime.copy_of("prev_backbone", model.backbone)  # Theta_l^{t-1}
        set_shared(model, self.manifest, parameters)  # Theta_g^t and Phi_g^t (Eq. 2, 4)
        global_backbone = self.runtime.copy_of("global_backbone", model.backbone)
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

    def _optimizer(self, model: FedFRModel, st: FedFRSiteState | None, rnd: int) -> tuple[torch.optim.SGD, float]:
        """The round's SGD at the round's lr: a fresh SGD every round (paper, official code);
        ``fedfr.keep_optimizer_state``: last round's momentum (its state also brings back last
        round's lr: the round's lr is set after)."""
        lr = round_learning_rate(self.f.lr, self.f.lr_milestones, self.f.lr_gamma, rnd)
        opt = self.runtime.optimizer(
            lambda: torch.optim.SGD(
                model.parameters(), lr=lr, momentum=self.f.momentum, weight_decay=self.f.weight_decay
            ),
            saved=st.optimizer if st is not None else None,
            carried=self.f.keep_optimizer_state,
        )
        for group in opt.param_groups:
            group["lr"] = lr
        return opt, lr

    def impostors(self) -> list[list[Record]]:
        """The non-mated probes: the test images of the sites named by ``impostor_roots`` (in that
        order), else every public image."""
        if self._impostors is None:
            roots = [r for r in self.s.impostor_roots.split(os.pathsep) if r]
            self._impostors = [FaceSite(r).test for r in roots] or [list(self.public.records)]
        return self._impostors

    def _loader(self, hard_negatives: np.ndarray, rnd: int) -> DataLoader:
        """Local images (labels 0..K_l-1) and this round's public hard negatives (public labels): the
        loader's dataset is every local and public image, the round's indices pick."""
        local, public = list(self.data.train), list(self.public.records)
        indices = list(range(len(local))) + [len(local) + int(i) for i in hard_negatives]
        return self.runtime.loader(
            lambda: FaceImages(
                local + public,
                face_transform(self.f.image_size, train=True, flip=self.f.flip),
                [False] * len(local) + [True] * len(public),
            ),
            batch_size=self.f.batch_size,
            num_workers=self.cfg.train.num_workers,
            seed=self.round_seed(rnd, "loader"),
            indices=indices,
            drop_last=len(indices) > self.f.batch_size,
        )
