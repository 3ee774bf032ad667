"""FedFR settings (Liu et al., AAAI 2022), the ``fedfr`` section of ExperimentConfig (``task: fedfr``).

Defaults are the paper's (held here only: ``conf/experiment/fedfr.yaml`` sets the task); ``experiment=fedfr-demo``
shrinks the model and the data for a 2-core CPU. Settings shared with FedReID stay where they are:
``rounds`` (T), ``sites``, ``strategy.fraction``/``min_*``, ``privacy``, ``superlink``,
``train.threads``/``train.num_workers`` (process settings) and ``eval.device``/``eval.batch_size``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

# The names of common.models.face.FACE_BACKBONES (not imported: the config must not pull in torch;
# tests/common/test_fedfr_config.py checks that the two agree).
BACKBONES = ("sphere4", "sphere20", "sphere36", "sphere64")
STAGES = ("train", "pretrain")
INIT_LOCAL = ("imprint", "random")
BIAS_INIT = ("zero", "sphereface2")
# common.evaluation.fedfr_protocols.IDENTIFICATION_PROTOCOLS (a test checks that they agree)
IJBC_IDENTIFICATION = ("nist", "insightface")
PUBLIC_NEGATIVES = ("hard", "all")


@dataclass
class FedFRConfig:
    # What `fedserver task=fedfr` does: "pretrain" = CosFace on the public data, writing Theta_g^0
    # and Phi_g to `pretrained`; "train" = the federated run that starts from that checkpoint.
    stage: str = "train"
    public_root: str = ""  # identity folders of the public data D_g (server: pretrain; sites: HN)
    pretrained: str = ""  # checkpoint of stage=pretrain; "" = <run_dir>/pretrained.pt

    # Model: the 64-layer SphereFace/CosFace CNN, 512-d, 112x112 inputs in [-1, 1].
    backbone: str = "sphere64"  # sphere4 (CPU tests) | sphere20 | sphere36 | sphere64
    embedding_dim: int = 512
    image_size: int = 112

    # Losses (s = s' = 30, m = m' = 0.4, tau = 0.5, lambda = 0.7, t' = 3; a = (1, 5, 10)).
    s: float = 30.0  # CosFace scale (pre-training and balanced CosFace)
    m: float = 0.4  # CosFace margin
    hard_negatives: bool = True  # false: no public data in local training (ablation row 2)
    t_hn: float = 0.4  # hard-negative threshold t_HN = m
    # which public images join local training when hard_negatives is on: "hard" = FedFR's selection
    # (cos > t_HN to the site's data); "all" = every public image (Table 1's "+ public data" row)
    public_negatives: str = "hard"
    hn_chunk: int = 8192  # public features scored this many at a time (memory bound)
    contrastive: bool = True  # MOON term (ablation)
    tau: float = 0.5
    dfc: bool = True  # DFC branch with margin BCE (ablation)
    bce_lambda: float = 0.7
    bce_r: float = 30.0  # s'
    bce_m: float = 0.4  # m'
    bce_t: float = 3.0  # t' of g(z)
    # b at a site's first round: "zero" (the official FedFR code) or "sphereface2" (SphereFace2's
    # balancing init, ~8.5 for K_l = 20: it asks negatives for cos < ~0.1 from the start, which
    # bends the DFC space hard when the generic model's impostor cosines are still spread)
    bce_bias_init: str = "zero"
    alpha: list[float] = field(default_factory=lambda: [1.0, 5.0, 10.0])  # a1 L_cos + a2 L_con + a3 L_BCE
    # W_l and Omega at a site's first round: "imprint" = the mean global-model feature of each
    # local identity (what the official code does), "random" = N(0, 0.01) / xavier.
    init_local: str = "imprint"

    # Local training: SGD lr 0.001, wd 5e-4 (momentum 0.9 as the official code), E = 4 epochs.
    local_epochs: int = 4  # E
    batch_size: int = 64
    lr: float = 0.001
    # Rounds from which the local lr is multiplied by lr_gamma once more (round t trains at
    # lr * lr_gamma^(number of milestones <= t)); [] = constant lr, the paper's setting.
    lr_milestones: list[int] = field(default_factory=list)
    lr_gamma: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    # false (the paper and the official code): a fresh SGD every round; true: a site restores last
    # round's momentum buffers onto the new global model
    keep_optimizer_state: bool = False
    max_steps_per_epoch: int = 0  # 0 = whole epoch; > 0 caps an epoch (demo/tests)
    flip: bool = True  # random horizontal flip (insightface training augmentation)

    # Pre-training of the generic model on the public data (CosFace, s = 30, m = 0.4).
    pretrain_epochs: int = 20
    pretrain_lr: float = 0.1
    pretrain_batch_size: int = 128
    pretrain_milestones: list[int] = field(default_factory=lambda: [10, 15, 18])  # lr x0.1 at these epochs
    # The BN-free sphere nets do not survive lr 0.1 from the first step (the feature norm grows by
    # orders of magnitude in one step at 112x112): the lr rises linearly over the first pretrain_warmup_steps
    # optimiser steps (SphereFace/CosFace-style warm-up; 0 = none), and the gradient norm of each
    # step is clipped to pretrain_max_grad_norm (0 = no clipping).
    pretrain_warmup_steps: int = 2000
    pretrain_max_grad_norm: float = 10.0

    # Evaluation (`fedeval task=fedfr`, and the generic part after each round when ijbc_root is set).
    # IJB-C folder: meta/ (ijbc_face_tid_mid.txt, ..., ijbc_name_5pts_score.txt) and loose_crop/.
    # Images are aligned to the ArcFace 112x112 template by their five landmarks; without the
    # landmarks file only aligned 112x112 crops are accepted (common/datasets/ijbc_images.py).
    ijbc_root: str = ""
    ijbc_detector_score: bool = True  # image features x detector score (insightface's D1; needs the landmarks file)
    ijbc_flip: bool = False  # image feature + its mirror's (insightface's F1)
    ijbc_identification: str = "nist"  # 1:N: nist (G1, G2 open set, mean) | insightface (ijb_1n.py: G1+G2)
    far_targets: list[float] = field(default_factory=lambda: [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1])
    fpir_targets: list[float] = field(default_factory=lambda: [0.01, 0.1])  # IJB-C 1:N (the generic model)
    # Personalised 1:N: the paper names no FPIR points. A site has ~156k non-mated probes at the
    # paper's scale (every other site's test images), so points down to 1e-4 (~16 probes) are measurable.
    personal_fpir_targets: list[float] = field(default_factory=lambda: [1e-4, 1e-3, 1e-2, 1e-1])
    ranks: list[int] = field(default_factory=lambda: [1, 5, 10])
    # The personalised protocol runs at the sites, in Flower's evaluate round: after every
    # personal_every rounds (0 = none but the last) and after the last round, every site scores the
    # global model, its Theta_l and [Theta_l, Pi_l] on its own identities (client/fedfr/site_evaluation.py).
    personal_every: int = 0
    # The offline scorer's generic models on the personalised protocol (a one-machine run): site ->
    # {data_root}; a site not listed is read from conf/site/<site>.yaml. Each site's data_root holds
    # train/ (registered) and test/ (probes).
    eval_sites: dict[str, dict[str, str]] = field(default_factory=dict)
    max_genuine_pairs_per_site: int = 0  # 0 = every same-identity pair of a site's test images

    def validate(self) -> None:
        def bad(key: str, expected: str, found: Any) -> ValueError:
            return ValueError(f"config fedfr.{key}: expected {expected}, found {found!r}")

        if self.stage not in STAGES:
            raise bad("stage", f"one of {', '.join(STAGES)}", self.stage)
        if self.backbone not in BACKBONES:
            raise bad("backbone", f"one of {', '.join(BACKBONES)}", self.backbone)
        if self.bce_bias_init not in BIAS_INIT:
            raise bad("bce_bias_init", f"one of {', '.join(BIAS_INIT)}", self.bce_bias_init)
        if self.public_negatives not in PUBLIC_NEGATIVES:
            raise bad("public_negatives", f"one of {', '.join(PUBLIC_NEGATIVES)}", self.public_negatives)
        if self.ijbc_identification not in IJBC_IDENTIFICATION:
            raise bad("ijbc_identification", f"one of {', '.join(IJBC_IDENTIFICATION)}", self.ijbc_identification)
        if self.init_local not in INIT_LOCAL:
            raise bad("init_local", f"one of {', '.join(INIT_LOCAL)}", self.init_local)
        for key in ("embedding_dim", "image_size", "local_epochs", "hn_chunk", "pretrain_epochs"):
            if getattr(self, key) < 1:
                raise bad(key, ">= 1", getattr(self, key))
        for key in ("pretrain_warmup_steps", "pretrain_max_grad_norm"):
            if not getattr(self, key) >= 0:
                raise bad(key, ">= 0 (0 = off)", getattr(self, key))
        for key in ("batch_size", "pretrain_batch_size"):
            if getattr(self, key) < 2:
                raise bad(key, ">= 2", getattr(self, key))
        for key in ("s", "bce_r", "tau", "lr", "pretrain_lr", "bce_t"):
            if not getattr(self, key) > 0:
                raise bad(key, "> 0", getattr(self, key))
        if any(not isinstance(r, int) or r < 1 for r in self.lr_milestones):
            raise bad("lr_milestones", "a list of round numbers >= 1", self.lr_milestones)
        if not 0.0 < self.lr_gamma <= 1.0:
            raise bad("lr_gamma", "a factor in (0, 1]", self.lr_gamma)
        if not -1.0 <= self.t_hn <= 1.0:
            raise bad("t_hn", "a cosine in [-1, 1]", self.t_hn)
        if not 0.0 < self.bce_lambda < 1.0:
            raise bad("bce_lambda", "lambda in (0, 1)", self.bce_lambda)
        if len(self.alpha) != 3 or any(a < 0 or not math.isfinite(a) for a in self.alpha):
            raise bad("alpha", "three non-negative weights [a1, a2, a3]", self.alpha)
        for key in ("far_targets", "fpir_targets", "personal_fpir_targets"):
            if not getattr(self, key) or any(not 0.0 < a < 1.0 for a in getattr(self, key)):
                raise bad(key, "a non-empty list of rates in (0, 1)", getattr(self, key))
        if any(k < 1 for k in self.ranks):
            raise bad("ranks", "ranks >= 1", self.ranks)
        if self.personal_every < 0:
            raise bad("personal_every", "rounds >= 0 (0 = after the last round only)", self.personal_every)
        for site, d in self.eval_sites.items():
            if not isinstance(d, dict) or not set(d) <= {"data_root"}:
                raise bad(f"eval_sites.{site}", "a mapping with data_root", d)


def check_lr_milestones(milestones: list[int], rounds: int) -> None:
    """Refuse an lr milestone past the run's last round: a run of ``rounds`` rounds would never
    decay its learning rate and train every round at the undecayed rate without saying so."""
    late = sorted(r for r in milestones if r > rounds)
    if late:
        raise ValueError(
            f"config fedfr.lr_milestones: expected rounds within the run (1..rounds={rounds}), found {late} past "
            f"the last round, so the lr would never decay; set rounds >= {late[0]} or fedfr.lr_milestones "
            f"(e.g. fedfr.lr_milestones=[{rounds}], or [] for a constant lr)"
        )
