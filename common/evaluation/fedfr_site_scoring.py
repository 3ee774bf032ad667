"""FedFR's personalised protocol scored for ONE site, from what that site holds (Liu et al., AAAI 2022).

The site's own registered (train/) and test/ images, and the non-mated probes it has: the test
images of other sites when its operator gives their folders (``impostor_roots``, the paper's
protocol, as on a one-machine benchmark), else the public identities' images (every site has them).
Each model named in ``models`` embeds them all; :func:`personalised_site_metrics` scores them
(``common/evaluation/fedfr_protocols.py``).

The same code scores a site inside its ``NumPyClient.evaluate`` (``client/fedfr/site_evaluation.py``)
and in the offline scorer of a one-machine run (``server/fedfr/evaluate.py``): ``embed_fn`` lets the
latter embed a model shared by every site once per image set.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
from torch import nn

from common.config.fedfr import FedFRConfig
from common.datasets.base import Record
from common.datasets.face_folder import FaceSite
from common.evaluation.fedfr_protocols import SiteFeatures, personalised_site_metrics

# (model, images) -> their features (n, d)
EmbedFn = Callable[[nn.Module, Sequence[Record]], np.ndarray]


def site_features(
    model: nn.Module, own: FaceSite, impostors: Sequence[Sequence[Record]], site_index: int, embed_fn: EmbedFn
) -> SiteFeatures:
    """The site's features in the protocol's layout: its own test images at ``site_index`` among the
    probe sets, each impostor set at the other positions in the given order."""
    if not 0 <= site_index <= len(impostors):
        raise ValueError(f"site index {site_index}: expected 0..{len(impostors)} (one position per probe set)")
    sets: list[Sequence[Record]] = list(impostors)
    sets.insert(site_index, own.test)
    probes = [embed_fn(model, s) for s in sets]
    labels = [np.array([r.pid for r in s]) for s in sets]
    return SiteFeatures(embed_fn(model, own.train), np.array([r.pid for r in own.train]), probes, labels)


def score_site(
    models: Mapping[str, nn.Module],
    own: FaceSite,
    impostors: Sequence[Sequence[Record]],
    site_index: int,
    f: FedFRConfig,
    embed_fn: EmbedFn,
) -> dict[str, dict[str, float]]:
    """``{model name: {metric: value}}`` of one site: TAR@FAR, TPIR@FPIR (``personal_fpir_targets``)
    and rank-k on its own identities; the genuine-pair sample (``max_genuine_pairs_per_site``) is
    seeded by ``site_index``."""
    if not any(len(s) for s in impostors):
        raise ValueError("no non-mated probe images: the personalised protocol needs images of other identities")
    out = {}
    for name, model in models.items():
        sf = site_features(model, own, impostors, site_index, embed_fn)
        out[name] = personalised_site_metrics(
            site_index, sf, f.far_targets, f.personal_fpir_targets, f.ranks, f.max_genuine_pairs_per_site
        )
    return out


def genuine_pairs(own: FaceSite) -> int:
    """Same-identity pairs of the site's test images (the 1:1 protocol's genuine pairs before any cap)."""
    counts = np.bincount([r.pid for r in own.test]) if own.test else np.zeros(0, np.int64)
    return int((counts * (counts - 1) // 2).sum())


# the models a site scores in Flower's evaluate round, by their key on the wire -> their name in the
# evaluation's tables (server/fedfr/evaluate.py)
SITE_ROWS = {
    "global": "FedFR Theta_g",  # the global model the coordinator sent
    "local": "local Theta_l",  # the site's own backbone (diagnostic: no DFC)
    "personal": "personalised [Theta_l, Pi_l]",  # f' = Pi(Theta_l(x))
}
# the counts a site reports with its figures
SITE_COUNTS = ("test_images", "genuine_pairs", "impostor_images")


def metric_names(f: FedFRConfig) -> list[str]:
    """The figures of the personalised protocol, as :func:`personalised_site_metrics` names them."""
    names = [f"TAR@FAR={a:g}" for a in f.far_targets] + [f"TPIR@FPIR={a:g}" for a in f.personal_fpir_targets]
    return names + [f"rank-{k}" for k in f.ranks]


def reply_keys(f: FedFRConfig) -> list[str]:
    """Every number key of a site's evaluate reply: ``<row>/<metric>`` and the counts."""
    return [f"{row}/{m}" for row in SITE_ROWS for m in metric_names(f)] + list(SITE_COUNTS)
