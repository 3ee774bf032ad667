"""The FedReID site: a Flower ``NumPyClient`` holding the private data, head and local expert.

One round (``fit``, the skeleton of ``client/site.py``): check the manifest, take the embedding
from the server and the head from the site state (Eq. 7), start the local expert from this site's
model at the end of its previous round (Eq. 10), train t_max (Eq. 3, 9-13), save the state
atomically and return ONLY the shared tensors (the embedding; nothing of the head ever leaves the
site), packed into one array both ways (``common/params.py``). The model, the expert, the
optimiser and the loader come from the site's runtime (``client/runtime/site_runtime.py``), which builds
them or keeps them between rounds; a model with a state to take is built straight into its
tensors, without its random initialisation (``common/models/from_state.py``).
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader

from client.fedreid.state import FEDREID_STATE, FedReIDSiteState
from client.fedreid.train import make_optimizer, set_round_lr, train_round
from client.runtime.settings import SiteSettings
from client.site import SiteClient
from common.config.experiment import ExperimentConfig
from common.config.modes import mode_of
from common.datasets import build_reader
from common.datasets.image_dataset import ImageDataset
from common.datasets.transforms import train_transform
from common.models.builder import expected_manifest, model_for
from common.models.reid import ReIDModel
from common.params import set_shared

log = logging.getLogger("fedclient")


@dataclass
class ReIDRound:
    """One round's modules: the model (Eq. 7), the local expert (Eq. 10, or None), their optimisers."""

    model: ReIDModel
    expert: ReIDModel | None
    opt: torch.optim.Optimizer
    eopt: torch.optim.Optimizer | None
    loader: DataLoader
    label_offset: int


class FedReIDClient(SiteClient):
    store = FEDREID_STATE

    def __init__(self, cfg: ExperimentConfig, settings: SiteSettings):
        super().__init__(cfg, settings)
        self.manifest = expected_manifest(cfg)
        self._shared = frozenset(self.manifest.keys)
        self.data = build_reader(settings.reader, settings.data_root)
        self.num_classes = self.data.splits.num_train_pids
        self.mode = mode_of(cfg.strategy.mode)

    def build_key(self):
        return (repr(self.cfg), self.num_classes)

    def state_identity(self) -> dict:
        return {"site": self.s.site, "manifest_hash": self.manifest.hash, "num_classes": self.num_classes}

    def model_name(self) -> str:
        return f"{self.cfg.model.backbone}, mode {self.cfg.strategy.mode}"

    def initial_model(self) -> ReIDModel:
        return model_for(self.cfg, self.num_classes)

    def num_examples(self) -> int:
        return len(self.data.train)

    def get_properties(self, config):
        """Who this site is (the coordinator names every new node by it, server/strategy/sites.py) and how many
        training identities it has (the census of a common-head baseline, server/fedreid/fedavg_strategy.py;
        nothing else about its data)."""
        return {"site": self.s.site, "num_identities": int(self.num_classes)}

    def prepare_round(self, st, parameters, server_round, config) -> ReIDRound:
        model, expert = self._round_models(st, parameters)
        opt, eopt = self._optimizers(model, expert, st, server_round)
        return ReIDRound(model, expert, opt, eopt, self._loader(server_round), self._label_offset(config))

    def train_round(self, r: ReIDRound) -> dict[str, float]:
        t = self.cfg.train
        return train_round(
            r.model,
            r.expert,
            r.loader,
            r.opt,
            r.eopt,
            unit=t.unit,
            iters=t.local_iters,
            temperature=t.temperature,
            device=self.device,
            max_steps_per_epoch=t.max_steps_per_epoch,
            label_offset=r.label_offset,
            use_channels_last=t.channels_last,
        )

    def state_to_keep(self, st, r: ReIDRound, stats, server_round) -> FedReIDSiteState:
        return FedReIDSiteState(
            site=self.s.site,
            manifest_hash=self.manifest.hash,
            num_classes=self.num_classes,
            last_round=server_round,
            rounds_trained=(st.rounds_trained if st else 0) + 1,
            model=self.runtime.snapshot(self._kept_tensors(r.model)),
            optimizer=self.runtime.optimizer_state(r.opt) if self.cfg.train.keep_optimizer_state else None,
            history=(st.history if st else []) + [{"round": server_round, **stats}],
        )

    def _round_models(
        self, st: FedReIDSiteState | None, parameters: list[np.ndarray]
    ) -> tuple[ReIDModel, ReIDModel | None]:
        """The round's model (own head, the server's embedding: Eq. 7) and local expert (Eq. 10), on the device.

        Built anew on a site's first round (no state), else at the model of the state.
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
        # Eq. (7): own head (and own integer buffers) from the state
        model = self.runtime.module("model", build, at=last, continues=True)
        expert = None
        if self.mode.expert and self.cfg.train.local_expert:  # never in plain fedavg / local (common/config/modes.py)
            # Eq. (10): the model at the end of the previous round
            expert = self.runtime.module("expert", build, at=last)
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

    def _optimizers(self, model, expert, st, server_round):
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
        # a fresh SGD every round (both papers' public codes); train.keep_optimizer_state: last round's momentum
        opt = self.runtime.optimizer(
            lambda: make_optimizer(model, **kw),
            saved=st.optimizer if st is not None else None,
            carried=t.keep_optimizer_state,
        )
        for o in (opt, eopt):
            if o is not None:
                set_round_lr(o, server_round, t.lr_step_rounds, t.lr_gamma)
        return opt, eopt

    def _loader(self, server_round: int) -> DataLoader:
        """The round's loader: two views of every training image."""
        t, m = self.cfg.train, self.cfg.model
        train = self.data.train
        if len(train) < t.batch_size:
            raise ValueError(
                f"site {self.s.site}: {len(train)} training images is fewer than one batch ({t.batch_size})"
            )
        return self.runtime.loader(
            lambda: ImageDataset(train, train_transform(m.height, m.width), views=2),
            batch_size=t.batch_size,
            num_workers=t.num_workers,
            seed=self.round_seed(server_round, "loader"),
            indices=range(len(train)),
            drop_last=True,
        )
