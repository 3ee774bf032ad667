"""FedFR protocols against plain computations: template features, IJB-C 1:1/1:N, personalised 1:1/1:N."""

import itertools

import numpy as np

from common.datasets.ijbc import IJBCMeta
from common.evaluation.fedfr_protocols import (
    SiteFeatures,
    ijbc_identification,
    ijbc_verification,
    impostor_score_source,
    mean_over_sites,
    personalised_site_metrics,
    template_features,
)
from common.evaluation.identification import tpir_at_fpir
from common.evaluation.verification import tar_at_far


def plain_template_features(feats, templates, medias):
    """insightface's image2template_feature, loop by loop: media mean, template sum, L2 norm."""
    out = {}
    for t in sorted(set(templates.tolist())):
        in_t = templates == t
        media_feats = []
        for m in sorted(set(medias[in_t].tolist())):
            media_feats.append(feats[in_t & (medias == m)].mean(axis=0))
        s = np.sum(media_feats, axis=0)
        out[t] = s / np.linalg.norm(s)
    return out


def test_template_features_media_average_then_template_sum_then_normalise():
    rng = np.random.default_rng(0)
    templates = np.array([5, 5, 5, 5, 2, 2, 9])
    medias = np.array([1, 1, 1, 7, 3, 3, 4])  # template 5: a 3-frame video and one photo
    feats = rng.normal(size=(7, 4))
    ids, tf = template_features(feats, templates, medias)
    plain = plain_template_features(feats, templates, medias)
    assert ids.tolist() == [2, 5, 9]
    for i, t in enumerate(ids):
        np.testing.assert_allclose(tf[i], plain[int(t)], rtol=1e-12)
    # the video counts as one media: not the plain mean of the 4 images
    naive = feats[:4].mean(0) / np.linalg.norm(feats[:4].mean(0))
    assert not np.allclose(tf[1], naive)
    # a media id shared by two templates is averaged within each template only
    _, tf2 = template_features(feats[:6], np.array([5, 5, 5, 5, 2, 2]), np.array([1, 1, 1, 7, 1, 1]))
    np.testing.assert_allclose(tf2[0], plain_template_features(feats[4:6], templates[4:6], medias[4:6])[2])


def test_ijbc_one_to_one_and_one_to_n_against_direct_scores():
    rng = np.random.default_rng(1)
    ids = np.array([1, 2, 3, 4, 5, 6])
    feats = rng.normal(size=(6, 8))
    feats /= np.linalg.norm(feats, axis=1, keepdims=True)
    pairs = np.array([[1, 3, 1], [1, 4, 0], [2, 4, 1], [2, 3, 0], [1, 5, 0], [2, 6, 0], [1, 6, 1]])
    got = ijbc_verification(ids, feats, pairs, [0.25, 0.5])
    s = np.array([feats[a - 1] @ feats[b - 1] for a, b, _ in pairs])
    assert got == tar_at_far(s[pairs[:, 2] == 1], s[pairs[:, 2] == 0], [0.25, 0.5])
    meta = IJBCMeta(
        [],
        np.array([]),
        np.array([]),
        pairs,
        {"G1": np.array([[1, 10]]), "G2": np.array([[2, 20]])},
        np.array([[3, 10], [4, 20], [5, 30], [6, 10]]),
    )
    out = ijbc_identification(ids, feats, meta, [0.5], [1])
    r1 = tpir_at_fpir(feats[[2, 3, 4, 5]], np.array([10, 20, 30, 10]), feats[[0]], np.array([10]), [0.5], [1])
    assert out["G1/TPIR@FPIR=0.5"] == r1.tpir[0.5] and out["G1/rank-1"] == r1.cmc[1]
    assert out["mean/rank-1"] == (out["G1/rank-1"] + out["G2/rank-1"]) / 2


def unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_personalised_protocol_against_brute_force():
    rng = np.random.default_rng(2)
    # site 0: 3 identities, 4 test images each; sites 1, 2: other people's test images
    labels = [np.repeat(np.arange(3), 4), np.repeat(np.arange(2), 3), np.repeat(np.arange(2), 2)]
    centres = rng.normal(size=(3, 6))
    probes = [
        unit(centres[labels[0]] + 0.6 * rng.normal(size=(12, 6))),
        unit(rng.normal(size=(6, 6))),
        unit(rng.normal(size=(4, 6))),
    ]
    gallery = unit(centres[np.repeat(np.arange(3), 5)] + 0.6 * rng.normal(size=(15, 6)))
    g_labels = np.repeat(np.arange(3), 5)
    f = SiteFeatures(gallery, g_labels, probes, labels)
    targets, fpir = [0.01, 0.1], [0.1, 0.5]
    got = personalised_site_metrics(0, f, targets, fpir, [1, 2])
    own = probes[0]
    genuine = [own[a] @ own[b] for a, b in itertools.combinations(range(12), 2) if labels[0][a] == labels[0][b]]
    impostor = [own[a] @ o[b] for o in probes[1:] for a in range(12) for b in range(len(o))]
    assert len(genuine) == 3 * 6 and len(impostor) == 12 * 10
    want = tar_at_far(np.array(genuine), np.array(impostor, np.float32), targets)
    for a in targets:
        assert got[f"TAR@FAR={a:g}"] == want[a]
    means = np.stack([gallery[g_labels == k].mean(0) for k in range(3)])  # mean registered feature
    r = tpir_at_fpir(
        np.concatenate(probes), np.concatenate([labels[0], np.full(10, -1)]), means, np.arange(3), fpir, [1, 2]
    )
    for a in fpir:
        assert got[f"TPIR@FPIR={a:g}"] == r.tpir[a]
    assert got["rank-1"] == r.cmc[1] and got["rank-2"] == r.cmc[2]
    assert mean_over_sites({"a": {"x": 0.2}, "b": {"x": 0.6}}) == {"x": 0.4}


def test_impostor_stream_is_every_cross_site_pair_and_can_be_read_twice():
    rng = np.random.default_rng(3)
    own, others = rng.normal(size=(5, 3)), [rng.normal(size=(7, 3)), rng.normal(size=(2, 3))]
    src = impostor_score_source(own, others, chunk_rows=3)
    first = np.concatenate(list(src()))
    np.testing.assert_allclose(
        np.sort(first), np.sort(np.concatenate([(own @ o.T).ravel() for o in others])), rtol=1e-6
    )
    np.testing.assert_array_equal(first, np.concatenate(list(src())))
