"""Typed experiment configuration behind ``conf/`` (validated; unknown keys are errors).

These dataclasses hold every default and every type, once: they are the schema Hydra composes
``conf/`` onto (``common/config/compose.py``), and ``conf/*.yaml`` hold only what differs from
them. ``ExperimentConfig.from_dict`` merges a dict onto them (``common/config/structured.py``)
and checks every value. The dict (not the objects) travels: the sites get ``site_view()`` as Flower's run config,
the ServerApp reads the whole dict from a file on the coordinator (``common/config/run.py``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.config.engine import EngineConfig
from common.config.fedfr import FedFRConfig
from common.config.modes import MODES
from common.config.structured import build

SITE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # a site name is also a file name: no path
SAMPLINGS = ("paper", "public")  # strategy.sampling: all sites train and the sampled are averaged, or only they train


def _bad(key: str, expected: str, found: Any) -> ValueError:
    """The error of a wrong config key: the key, what was expected and what was found."""
    return ValueError(f"config {key}: expected {expected}, found {found!r}")


def check_site_name(site: str) -> str:
    """``site`` unchanged, or ValueError: site names become file names (conf/site/<site>.yaml, state folders)."""
    if not isinstance(site, str) or not SITE_NAME.fullmatch(site):
        raise ValueError(
            f"site name {site!r}: expected letters, digits, '_', '-', '.' (at most 64, not starting "
            "with '.' or '-', no '/')"
        )
    return site


def sites_per_round(fraction: float, num_sites: int) -> int:
    """ceil(S * N), at least 1 (Eq. 5/8); the tiny epsilon keeps 0.3 * 10 at 3, not 4."""
    return max(1, math.ceil(fraction * num_sites - 1e-9))


def normalize_pretrained(value: str | None) -> str:
    """``model.pretrained`` as stored: ``imagenet``, ``none`` or a path (run folders of older versions
    wrote ``null`` for a random start)."""
    if value is None or str(value).strip().lower() in ("", "none", "null"):
        return "none"
    v = str(value).strip()
    return "imagenet" if v.lower() == "imagenet" else v


@dataclass
class ModelConfig:
    backbone: str = "resnet50"  # resnet10 | resnet18 | resnet34 | resnet50 (paper: resnet50)
    # imagenet (paper: torchvision's ImageNet weights, fetched once into the torch cache) | /path/to.pth
    # (an offline coordinator) | none (random start: warned about, recorded). common/models/pretrained.py
    pretrained: str | None = "imagenet"
    head_hidden: int = 512  # Eq. (2): FC(dim -> 512)
    dropout: float = 0.5
    head_activation: str = "relu"  # relu (paper) | leaky_relu (public re-implementation)
    height: int = 256  # input size (paper: 256x128)
    width: int = 128


@dataclass
class TrainConfig:
    unit: str = "epoch"  # t_max counts local "epoch"s or "step"s (the paper's text says steps)
    local_iters: int = 1  # t_max
    batch_size: int = 32
    lr_embedding: float = 0.01
    lr_head: float = 0.1
    momentum: float = 0.9  # SGD Nesterov
    nesterov: bool = True
    weight_decay: float = 5e-4
    # false (neither paper keeps it; both public codes build a fresh SGD every round): fresh momentum
    # each round; true: a site restores last round's SGD momentum onto the new global model
    keep_optimizer_state: bool = False
    lr_step_rounds: int = 40  # x lr_gamma every 40 rounds
    lr_gamma: float = 0.1
    local_expert: bool = True  # Eq. (10)-(13); false = the "no local expert" baseline
    temperature: float = 3.0  # T of Eq. (12)
    start_mix: float = 0.0  # public code's option: start = (1-a)*server + a*previous local (paper: 0)
    # training DataLoader workers (a site process keeps them across rounds); no draw depends on it
    # (common/datasets/round_sampling.py: per-sample augmentation seeds)
    num_workers: int = 0
    threads: int = 0  # torch threads per site process (0 = torch default)
    max_steps_per_epoch: int = 0  # 0 = whole epoch; >0 caps an epoch (demo/tests)
    # true: local training in the channels-last layout (faster convolutions on GPUs and many CPUs; the
    # same to float rounding, not bit for bit: common/models/channels_last.py)
    channels_last: bool = False


@dataclass
class StrategyConfig:
    # fedreid | fedavg (all parameters, one common head) | local (each site alone, no expert) |
    # local_expert (each site alone with its local expert); common/config/modes.py has the table
    mode: str = "fedreid"
    fraction: float = 1.0  # S: ceil(S*N) sites per round
    min_fit_sites: int = 1  # fewer valid replies than this: the round keeps the previous model
    min_available_sites: int = 4  # wait for this many sites before round 1 (later rounds go on down to min_fit_sites)
    # fedavg mode: logits of the common head, exactly the sum of the sites' identity counts (each site's
    # labels are offset by the counts of the sites before it; the counts come from the sites at round 1)
    fedavg_num_classes: int = 0
    # S as the paper writes it (Eq. 5-6): every site trains each round, the server averages ceil(S*N) of
    # them; "public": only the ceil(S*N) sampled sites train (the public code). Both sample by site name.
    sampling: str = "paper"  # paper | public
    aggregation: str = "mean"  # mean (Eq. 8, the paper) | trimmed_mean | median (Flower's functions)
    trim_fraction: float = 0.25  # trimmed_mean: cut this fraction at each end (of the valid updates)
    # Bounded influence: an update (minus what the site was sent) whose L2 norm exceeds norm_bound x the
    # round's lower-median norm is clipped to it, or rejected; 0 = no bound.
    norm_bound: float = 10.0
    norm_action: str = "clip"  # clip | reject
    # FedFR weights (Eq. 2/4): the operator's registry of each site's own image count; empty = the
    # count a site reports first, frozen for the run. Each weight is capped at weight_cap x the lower
    # median of the round's weights (0 = no cap).
    site_images: dict[str, int] = field(default_factory=dict)
    weight_cap: float = 10.0


@dataclass
class PrivacyConfig:
    beta: float = 0.0  # Eq. (14)-(15) white-noise scale (paper default 0)
    client_noise: bool = True  # Eq. (15): an independent draw on what each site receives
    # Client-level differential privacy (`privacy=dp`, docs/privacy.md): each averaged site's update of
    # the shared parameters is clipped to L2 norm clip_norm (C) and Gaussian noise of standard deviation
    # noise_multiplier * C is added to their sum; epsilon is accounted every round (common/dp_accountant.py)
    dp: bool = False
    clip_norm: float = 1.0  # C
    noise_multiplier: float = 1.0  # z (used when target_epsilon is 0)
    target_epsilon: float = 0.0  # > 0: z is solved so that the planned `rounds` spend exactly this epsilon
    delta: float = 0.0  # 0: 1 / identities^1.1
    identities: int = 0  # identities (people) in the whole federation: the default delta's rule
    max_epsilon: float = 0.0  # > 0: the run stops before the first round whose epsilon would exceed it
    # Secure aggregation (SecAgg+, docs/privacy.md): the coordinator learns only the sum of the sites'
    # updates of the shared parameters (`privacy=secagg`)
    secure_aggregation: bool = False
    secagg_clip_range: float = 8.0  # R: each value of a site's update is clipped to [-R, R] before quantisation
    secagg_quantization_range: int = 4194304  # Q: levels over [-R, R] (2**22); a mean is off by < 2R/Q
    secagg_shares: float = 1.0  # shares of each mask key: > 2 a count, in (0, 1] a fraction of the sites
    # shares that rebuild a key (>= 2 a count, in (0, 1] that fraction of the shares): the sum survives sites
    # that drop out after the key exchange while every site keeps this many live neighbours
    secagg_threshold: float = 0.67


@dataclass
class TargetConfig:
    reader: str = "market1501"  # any name of common.datasets.READERS
    root: str = ""
    num_splits: int = 10  # random half splits of sets without a fixed split (GRID: official splits)


@dataclass
class EvalConfig:
    every: int = 1  # evaluate the global embedding every N rounds (0 = never)
    metric: str = "cosine"  # cosine | euclidean
    normalize: bool = True  # L2-normalise features before ranking
    flip: bool = False  # average features of the image and its mirror
    batch_size: int = 128
    max_rank: int = 10
    device: str = "cpu"
    linear_probe: bool = False  # also a softmax probe's accuracy (gallery -> query) per target
    tensorboard: bool = True  # every round's metrics also as TensorBoard scalars in RUN_DIR/tensorboard/
    # the targets' images are decoded and resized once and kept across evaluations (uint8, H x W x 3 bytes
    # each) when all of them fit in this many MB; 0 = read every image again at every evaluation
    keep_decoded_mb: float = 2048.0
    # round k's evaluation runs on the coordinator's writer thread while round k+1 trains (the same
    # numbers: the same code and thread count); false = the sites wait for it (the last round's always)
    background: bool = True
    # name -> TargetConfig (typed in __post_init__: `++eval.targets.NAME.root=...` adds a plain mapping)
    targets: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.targets = {n: build(TargetConfig, t, f"eval.targets.{n}") for n, t in self.targets.items()}


@dataclass
class SuperLinkConfig:
    # host:port of the SuperLink. Flower 1.42 serves the Fleet API (sites), the Control API
    # (`flwr run`) and the Runtime API on this one HTTP(S) port.
    address: str = "0.0.0.0:9092"
    insecure: bool = False  # plain text: must be chosen explicitly
    ca_cert: str | None = None  # TLS: CA certificate, server certificate and key files
    cert: str | None = None
    key: str | None = None
    # Flower node authentication (needs TLS): only sites whose public key is registered may join.
    node_auth: bool = False
    site_keys: str | None = None  # folder of <site>.pub registered at start (`fedserver register-site`)
    # the coordinator's Ed25519 key that signs every instruction (sites verify it with coordinator.pub).
    # None: coordinator.key beside ca_cert (`fedserver certs` makes it); in plain text, RUN_DIR/coordinator.key
    # (made at the first start, kept for resume)
    coordinator_key: str | None = None
    # Keep the SuperLink's state in RUN_DIR/superlink.db (SQLite) for the run. Every start makes it
    # fresh, a `fedserver resume=RUN_DIR` too: a run folder's database is never reopened
    # (docs/security.md, Resume), so restart the sites' fedclient after a resume. Off by default:
    # SQLite also stores every parameter chunk and, on a busy machine, its write lock ("database is
    # locked") can fail requests of large models.
    persist_state: bool = False
    startup_timeout_s: float = 60.0
    # On an `address` other machines can reach, the SuperLink listens on 127.0.0.1:`loopback_port`
    # (0: a free port) and fedserver starts an nginx front on `address` that forwards only the
    # Fleet API (server/deploy/front.py, server/deploy/nginx_config.py); without nginx fedserver refuses to start.
    loopback_port: int = 0
    # `address` is reached only through a proxy of the operator's own: fedserver starts no front and
    # the SuperLink listens on `address` itself (the proxy must do what server/deploy/nginx_config.py does)
    behind_proxy: bool = False


# keys of ExperimentConfig that stay on the coordinator (ExperimentConfig.site_view)
SITE_HIDDEN = (
    "superlink",
    "run_dir",
    "app_dir",
    "resume_from",
    "eval.targets",
    "fedfr.pretrained",
    "fedfr.ijbc_root",
    "fedfr.public_root",
    "coordinator_state_dir",
)


@dataclass
class ExperimentConfig:
    task: str = "fedreid"
    name: str = "fedreid"
    seed: int = 0
    rounds: int = 100  # k_max
    sites: list[str] = field(default_factory=lambda: ["market1501", "dukemtmc", "cuhk03", "msmt17"])
    run_dir: str = "runs/fedreid"
    app_dir: str = ""  # the Flower app folder (this repository); empty = auto
    wait_for_sites_s: float = 600.0  # bounded wait for min_available_sites
    round_timeout_s: float = 3600.0  # a site that has not replied by then is dropped for the round
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    superlink: SuperLinkConfig = field(default_factory=SuperLinkConfig)
    fedfr: FedFRConfig = field(default_factory=FedFRConfig)  # task: fedfr (Liu et al., AAAI 2022)
    engine: EngineConfig = field(default_factory=EngineConfig)  # deployment | simulation (Flower's runtimes)
    # The coordinator's private folder (0700; "" = $FEDREID_COORDINATOR_STATE_DIR, else ~/.fedreid/coordinator):
    # the runs' noise secrets, which a run folder must not hold (server/strategy/noise_secret.py). On resume it
    # comes from the command line.
    coordinator_state_dir: str = ""
    # Set by `fedserver resume=RUN_DIR` (server/deploy/resume.py), not by hand: the checkpoint the ServerApp
    # continues from (round k+1 onwards). Empty for a new run.
    resume_from: str = ""

    @classmethod
    def from_json(cls, text: str) -> ExperimentConfig:
        """The config as it travels in Flower's run config (``experiment-json``)."""
        return cls.from_dict(json.loads(text or "{}"))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExperimentConfig:
        """The dict over the defaults above (types checked, unknown keys refused), then validated."""
        cfg = build(cls, d)
        cfg.validate()
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def site_view(self) -> dict[str, Any]:
        """What the sites receive (Flower's run config): the experiment without the coordinator's
        own settings. No ``superlink.*`` (addresses, TLS key and certificate paths, the key registry),
        no coordinator paths (``run_dir``, ``app_dir``, ``resume_from``, ``eval.targets``,
        ``fedfr.pretrained``, ``fedfr.ijbc_root``, ``fedfr.public_root``: a site names its own copy of
        the public data), no ``coordinator_state_dir``; ``from_dict`` fills them with defaults. The
        noise secret is never part of any config (``server/strategy/noise_secret.py`` keeps it in the
        coordinator's own folder).
        """
        d = self.to_dict()
        for key in SITE_HIDDEN:
            *parents, last = key.split(".")
            node = d
            for p in parents:
                node = node[p]
            node.pop(last, None)
        return d

    @property
    def sites_per_round(self) -> int:
        return sites_per_round(self.strategy.fraction, len(self.sites))

    def validate(self) -> None:
        """Every key checked, in this order; the first wrong one raises ValueError naming the key, what
        was expected and what was found."""
        self._check_model()
        self._check_task()
        self._check_strategy_mode()
        if not 0 <= self.superlink.loopback_port <= 65535:
            raise _bad("superlink.loopback_port", "a port in [0, 65535] (0: a free one)", self.superlink.loopback_port)
        self._check_privacy()
        self._check_training()
        if self.eval.metric not in ("cosine", "euclidean"):
            raise _bad("eval.metric", "cosine or euclidean", self.eval.metric)
        if not (isinstance(self.eval.keep_decoded_mb, int | float) and 0 <= self.eval.keep_decoded_mb < math.inf):
            raise _bad(
                "eval.keep_decoded_mb", "a number of MB >= 0 (0: decode at every evaluation)", self.eval.keep_decoded_mb
            )
        self._check_sites()
        self._check_aggregation()
        self._check_site_counts()

    def _check_model(self) -> None:
        self.model.pretrained = normalize_pretrained(self.model.pretrained)  # older run folders: null = none
        if self.model.pretrained.lower() == "torchvision":
            raise _bad(
                "model.pretrained",
                "imagenet (torchvision's weights API), none or a path to a .pth file",
                self.model.pretrained,
            )

    def _check_task(self) -> None:
        """The task, its own section, and the engine for the sites."""
        if self.task not in ("fedreid", "fedfr"):
            raise _bad("task", "fedreid or fedfr", self.task)
        if self.task == "fedfr":
            self.fedfr.validate()
        self.engine.validate(self.sites)

    def _check_strategy_mode(self) -> None:
        """S, the mode, and the common head's size of the modes that have one."""
        if not 0.0 < self.strategy.fraction <= 1.0:
            raise _bad("strategy.fraction", "S in (0, 1]", self.strategy.fraction)
        if self.strategy.mode not in MODES:
            raise _bad("strategy.mode", f"one of {', '.join(MODES)}", self.strategy.mode)
        if MODES[self.strategy.mode].common_head and self.strategy.fedavg_num_classes < 1:
            raise _bad(
                "strategy.fedavg_num_classes",
                ">= 1 in fedavg mode (one head size for all sites)",
                self.strategy.fedavg_num_classes,
            )

    def _check_privacy(self) -> None:
        """beta, secure aggregation's parameters and refusals, and with ``privacy.dp`` client-level DP's parameters and what it needs of the strategy."""
        if not 0.0 <= self.privacy.beta <= 1.0:
            raise _bad("privacy.beta", "beta in [0, 1]", self.privacy.beta)
        if self.privacy.secure_aggregation:
            self._check_secure_aggregation()
        if not self.privacy.dp:
            return
        p = self.privacy
        if not p.clip_norm > 0:
            raise _bad("privacy.clip_norm", "an L2 norm C > 0", p.clip_norm)
        if not p.noise_multiplier >= 0 or not p.target_epsilon >= 0 or not p.max_epsilon >= 0:
            raise _bad(
                "privacy.noise_multiplier / target_epsilon / max_epsilon",
                "numbers >= 0",
                [p.noise_multiplier, p.target_epsilon, p.max_epsilon],
            )
        if not 0.0 <= p.delta < 1.0:
            raise _bad("privacy.delta", "delta in (0, 1), or 0 for 1/identities^1.1", p.delta)
        if p.delta == 0 and p.identities < 2:
            raise _bad(
                "privacy.identities",
                "the number of identities in the federation (>= 2) for the default delta, or privacy.delta",
                p.identities,
            )
        if self.strategy.aggregation != "mean":
            raise _bad(
                "strategy.aggregation",
                "mean with privacy.dp (the noise is calibrated to a clipped mean; a median or trimmed mean "
                "has another sensitivity)",
                self.strategy.aggregation,
            )
        if MODES[self.strategy.mode].own_embedding:
            raise _bad("strategy.mode", "a mode that averages an update with privacy.dp", self.strategy.mode)

    def _check_secure_aggregation(self) -> None:
        """What secure aggregation rules out: anything that needs one site's update in the clear."""
        p, st = self.privacy, self.strategy
        clear = "with privacy.secure_aggregation (the coordinator sees only the sum of the updates)"
        if st.aggregation != "mean":
            raise _bad(
                "strategy.aggregation", f"mean {clear}; a median or trimmed mean needs each update", st.aggregation
            )
        if st.norm_action == "reject" and st.norm_bound > 0:
            raise _bad(
                "strategy.norm_action",
                f"clip or strategy.norm_bound=0 {clear}; rejecting a reply by its norm needs each update "
                "(privacy=dp: each site clips its own update to privacy.clip_norm)",
                st.norm_action,
            )
        if MODES[st.mode].own_embedding:
            raise _bad("strategy.mode", f"a mode that averages an update {clear}", st.mode)
        if self.sites_per_round < 2:
            raise _bad(
                "strategy.fraction / sites",
                f"at least 2 sites per round {clear}: a sum of one update is that update",
                self.sites_per_round,
            )
        if self.task == "fedfr" and any(site not in st.site_images for site in self.sites):
            raise _bad(
                "strategy.site_images",
                f"every site's own image count {clear}: each site applies its weight under the mask",
                sorted(st.site_images),
            )
        if not p.secagg_clip_range > 0:
            raise _bad("privacy.secagg_clip_range", "a range R > 0", p.secagg_clip_range)
        if not 1 < p.secagg_quantization_range < 2**31 // max(1, len(self.sites)):
            raise _bad(
                "privacy.secagg_quantization_range",
                "levels Q in (1, 2**31 / sites) (the masked sum runs modulo 2**32)",
                p.secagg_quantization_range,
            )
        if not (0 < p.secagg_shares <= 1 or (p.secagg_shares > 2 and float(p.secagg_shares).is_integer())):
            raise _bad("privacy.secagg_shares", "a fraction in (0, 1] or a whole count > 2", p.secagg_shares)
        if not (0 < p.secagg_threshold <= 1 or (p.secagg_threshold >= 2 and float(p.secagg_threshold).is_integer())):
            raise _bad("privacy.secagg_threshold", "a fraction in (0, 1] or a whole count >= 2", p.secagg_threshold)
        if p.secagg_shares > 2 and p.secagg_threshold >= p.secagg_shares:
            raise _bad(
                "privacy.secagg_threshold", f"fewer than privacy.secagg_shares={p.secagg_shares:g}", p.secagg_threshold
            )

    def _check_training(self) -> None:
        """Rounds and the local training's unit, length, batch and start mix."""
        if self.train.unit not in ("epoch", "step"):
            raise _bad("train.unit", "epoch or step", self.train.unit)
        if self.rounds < 1:
            raise _bad("rounds", ">= 1", self.rounds)
        if self.train.local_iters < 1:
            raise _bad("train.local_iters", ">= 1", self.train.local_iters)
        if self.train.batch_size < 2:
            raise _bad("train.batch_size", ">= 2 (BatchNorm in the head)", self.train.batch_size)
        if not 0.0 <= self.train.start_mix < 1.0:
            raise _bad("train.start_mix", "a in [0, 1)", self.train.start_mix)

    def _check_sites(self) -> None:
        """A non-empty list of distinct site names that are also safe file names."""
        if not self.sites:
            raise _bad("sites", "a non-empty list of site names", self.sites)
        for site in self.sites:
            if not isinstance(site, str) or not SITE_NAME.fullmatch(site):
                raise _bad("sites", "site names of letters, digits, '_', '-', '.' (at most 64, no path)", site)
        if len(set(self.sites)) != len(self.sites):
            raise _bad("sites", "distinct site names", self.sites)

    def _check_aggregation(self) -> None:
        """Sampling, the aggregation rule, the update-norm bound and the weights' cap and registry."""
        st = self.strategy
        if st.sampling not in SAMPLINGS:
            raise _bad("strategy.sampling", f"one of {', '.join(SAMPLINGS)}", st.sampling)
        if st.aggregation not in ("mean", "trimmed_mean", "median"):
            raise _bad("strategy.aggregation", "one of mean, trimmed_mean, median", st.aggregation)
        if not 0.0 <= st.trim_fraction < 0.5:
            raise _bad("strategy.trim_fraction", "a fraction in [0, 0.5)", st.trim_fraction)
        if not st.norm_bound >= 0:
            raise _bad(
                "strategy.norm_bound", "a multiple >= 0 of the round's median update norm (0 = off)", st.norm_bound
            )
        if st.norm_action not in ("clip", "reject"):
            raise _bad("strategy.norm_action", "clip or reject", st.norm_action)
        if not st.weight_cap >= 0:
            raise _bad("strategy.weight_cap", "a multiple >= 0 of the median weight (0 = no cap)", st.weight_cap)
        if st.site_images:
            wrong = {s: n for s, n in st.site_images.items() if isinstance(n, bool) or not isinstance(n, int) or n < 1}
            if wrong or sorted(st.site_images) != sorted(self.sites):
                raise _bad(
                    "strategy.site_images", f"a positive image count for each of the sites {self.sites}", st.site_images
                )

    def _check_site_counts(self) -> None:
        """The sites needed before round 1 and the valid updates a round needs, within the run's sites."""
        if not 1 <= self.strategy.min_available_sites <= len(self.sites):
            raise _bad(
                "strategy.min_available_sites",
                f"1..{len(self.sites)} (the number of sites)",
                self.strategy.min_available_sites,
            )
        if not 1 <= self.strategy.min_fit_sites <= self.sites_per_round:
            raise _bad("strategy.min_fit_sites", f"1..ceil(S*N)={self.sites_per_round}", self.strategy.min_fit_sites)

    def resolved_run_dir(self) -> Path:
        return Path(self.run_dir).expanduser().resolve()
