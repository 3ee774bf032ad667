"""IJB-C scored as insightface scores it: 5-point alignment, detector-score weighting, flip, its 1:N variant."""

import math

import numpy as np
import pytest
import torch
from PIL import Image

from common.config.compose import compose_experiment
from common.config.fedfr import IJBC_IDENTIFICATION
from common.datasets.base import Record
from common.datasets.face_align import ARCFACE_TEMPLATE, align_face, alignment_transform, template
from common.datasets.face_images import FaceImages, face_transform
from common.datasets.ijbc import LANDMARKS_FILE, read_ijbc_meta
from common.datasets.ijbc_images import IJBCImages, UnalignedImageError
from common.datasets.synthetic_faces import write_ijbc_layout
from common.evaluation.fedfr_protocols import IDENTIFICATION_PROTOCOLS, ijbc_identification, template_features
from common.evaluation.insightface_1n import insightface_identification
from common.evaluation.verification import tar_at_far
from common.models.face import build_face_backbone
from server.fedfr.evaluate import generic_metrics


def similarity(scale: float, degrees: float, tx: float, ty: float) -> np.ndarray:
    a = math.radians(degrees)
    return np.array(
        [[scale * math.cos(a), -scale * math.sin(a), tx], [scale * math.sin(a), scale * math.cos(a), ty], [0, 0, 1]]
    )


def apply(m: np.ndarray, pts: np.ndarray) -> np.ndarray:
    return pts @ m[:2, :2].T + m[:2, 2]


def blobs(shape: tuple[int, int], centres: np.ndarray, sigma: float) -> np.ndarray:
    """A uint8 RGB image with a Gaussian blob at each (x, y) centre (pixel centres at integers)."""
    y, x = np.mgrid[0 : shape[0], 0 : shape[1]].astype(np.float64)
    img = sum(np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * sigma**2)) for cx, cy in centres)
    return np.repeat((np.clip(img, 0, 1) * 255).round().astype(np.uint8)[..., None], 3, axis=2)


def centroid(img: np.ndarray, near: np.ndarray, r: int = 7) -> np.ndarray:
    x0, y0 = round(near[0]), round(near[1])
    win = img[y0 - r : y0 + r + 1, x0 - r : x0 + r + 1, 0].astype(np.float64)
    yy, xx = np.mgrid[y0 - r : y0 + r + 1, x0 - r : x0 + r + 1]
    return np.array([(win * xx).sum() / win.sum(), (win * yy).sum() / win.sum()])


@pytest.mark.parametrize(
    "scale, degrees, tx, ty", [(1.7, 20.0, 30.0, 45.0), (0.8, -35.0, 60.0, 10.0), (2.5, 5.0, -20.0, 10.0)]
)
def test_landmarks_under_a_known_similarity_are_aligned_to_the_template_within_a_pixel(scale, degrees, tx, ty):
    t = similarity(scale, degrees, tx, ty)  # template frame -> loose image
    landmarks = apply(t, ARCFACE_TEMPLATE)
    # the loose image: a blob where each landmark is (drawn directly in its own pixels)
    loose = blobs((300, 320), landmarks, sigma=2.0 * scale)
    # the estimated transform is the inverse of the known one (exact landmarks: exact fit)
    np.testing.assert_allclose(alignment_transform(landmarks).params, np.linalg.inv(t), atol=1e-9)
    aligned = align_face(loose, landmarks)
    assert aligned.shape == (112, 112, 3) and aligned.dtype == np.uint8
    for want in ARCFACE_TEMPLATE:
        got = centroid(aligned, want)
        assert np.linalg.norm(got - want) < 1.0, (got, want)
    # another output size scales the template
    small = align_face(loose, landmarks, size=56)
    for want in template(56):
        assert np.linalg.norm(centroid(small, want, r=4) - want) < 1.0


def test_bad_landmarks_are_refused_with_what_was_expected():
    with pytest.raises(ValueError, match=r"expected 5 finite \(x, y\) landmarks, shape \(5, 2\); found shape \(4, 2\)"):
        alignment_transform(np.zeros((4, 2)))
    with pytest.raises(ValueError, match="uint8"):
        align_face(np.zeros((20, 20, 3), np.float32), ARCFACE_TEMPLATE)


def test_detector_score_weighting_by_hand():
    f = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, -1.0]])
    templates, medias = np.array([7, 7, 7, 8]), np.array([1, 1, 2, 3])
    w = np.array([0.9, 0.1, 0.5, 0.3])
    _, tf = template_features(f, templates, medias, w)
    # by hand, template 7: media 1 = (0.9*[1,0] + 0.1*[0,1]) / 2 = [0.45, 0.05]; media 2 = 0.5*[1,1];
    # sum = [0.95, 0.55], normalised; template 8: 0.3*[2,-1] normalised = [2,-1]/sqrt(5)
    s = np.array([0.95, 0.55])
    np.testing.assert_allclose(tf[0], s / np.linalg.norm(s), rtol=1e-12)
    np.testing.assert_allclose(tf[1], np.array([2, -1]) / math.sqrt(5), rtol=1e-12)
    _, unweighted = template_features(f, templates, medias)
    u = np.array([0.5, 0.5]) + np.array([1.0, 1.0])
    np.testing.assert_allclose(unweighted[0], u / np.linalg.norm(u), rtol=1e-12)  # the weights did matter
    with pytest.raises(ValueError, match="one finite weight per image"):
        template_features(f, templates, medias, w[:3])


def brute_insightface_1n(probe, probe_ids, gallery, gallery_ids, fpirs, ranks):
    """insightface's ijb_1n.py evaluation, written out on the full matrix."""
    probe = probe / np.linalg.norm(probe, axis=1, keepdims=True)
    gallery = gallery / np.linalg.norm(gallery, axis=1, keepdims=True)
    sim = probe @ gallery.T
    mask = [int(np.flatnonzero(gallery_ids == p)[0]) for p in probe_ids]
    top = np.argsort(-sim, axis=1)
    out = {f"rank-{k}": np.mean([mask[i] in top[i, :k] for i in range(len(probe))]) for k in ranks}
    pos = sim[np.arange(len(probe)), mask].copy()
    neg = sim.copy()
    neg[np.arange(len(probe)), mask] = -2.0
    neg = np.sort(neg[neg > -2.0])[::-1]
    for a in fpirs:
        th = neg[math.ceil(len(probe) * a) - 1]
        out[f"TPIR@FPIR={a:g}"] = np.sum(pos > th) / len(probe)
    return out


def test_insightface_one_to_n_against_the_scripts_computation():
    rng = np.random.default_rng(4)
    gallery_ids = np.array([13, 4, 9, 21, 7, 30])
    centres = rng.normal(size=(6, 8))
    probe_ids = rng.choice(gallery_ids, 40)
    probe = centres[[int(np.flatnonzero(gallery_ids == p)[0]) for p in probe_ids]]
    probe = probe + rng.normal(scale=0.9, size=probe.shape)
    gallery = centres + rng.normal(scale=0.3, size=centres.shape)
    fpirs, ranks = [0.01, 0.1, 0.5], [1, 2, 5]
    want = brute_insightface_1n(probe, probe_ids, gallery, gallery_ids, fpirs, ranks)
    for chunk in (1, 7, 4096):  # the running top-n over chunks gives the full-matrix answer
        got = insightface_identification(probe, probe_ids, gallery, gallery_ids, fpirs, ranks, chunk_size=chunk)
        assert got == pytest.approx(want)
    assert 0 < want["TPIR@FPIR=0.1"] < 1 and want["rank-1"] < 1  # not a degenerate case
    with pytest.raises(ValueError, match="every probe subject in the gallery"):
        insightface_identification(probe, np.r_[probe_ids[:-1], 99], gallery, gallery_ids)
    with pytest.raises(ValueError, match="one gallery template per subject"):
        insightface_identification(probe, probe_ids, gallery, np.r_[gallery_ids[:-1], 13])


def test_protocol_names_and_defaults():
    assert tuple(IJBC_IDENTIFICATION) == tuple(IDENTIFICATION_PROTOCOLS) == ("nist", "insightface")
    f = compose_experiment(["experiment=fedfr"]).fedfr
    assert (f.ijbc_detector_score, f.ijbc_flip, f.ijbc_identification) == (True, False, "nist")
    with pytest.raises(ValueError, match="ijbc_identification: expected one of nist, insightface"):
        compose_experiment(["experiment=fedfr", "fedfr.ijbc_identification=closed"])


@pytest.fixture(scope="module")
def ijbc112(tmp_path_factory):
    """A small IJB-C-style folder of aligned 112x112 crops, plus a landmarks file (identity alignment)."""
    root = tmp_path_factory.mktemp("ijbc112")
    write_ijbc_layout(root, 4, probe_templates=1, media_per_template=2, images_per_media=2, size=112, seed=2)
    names = [ln.split()[0] for ln in (root / "meta" / "ijbc_face_tid_mid.txt").read_text().split("\n") if ln]
    scores = np.random.default_rng(0).uniform(0.2, 1.0, len(names))
    lines = [" ".join([n, *[f"{v:.4f}" for v in ARCFACE_TEMPLATE.ravel()], f"{s:.6f}"]) for n, s in zip(names, scores)]
    (root / "landmarks.txt").write_text("\n".join(lines) + "\n")
    return root


def _cfg(**fedfr):
    cfg = compose_experiment(
        [
            "experiment=fedfr",
            "fedfr.backbone=sphere4",
            "fedfr.embedding_dim=16",
            "fedfr.image_size=112",
            "eval.batch_size=16",
            "train.num_workers=0",
        ]
    )
    for k, v in fedfr.items():
        setattr(cfg.fedfr, k, v)
    return cfg


@pytest.mark.parametrize("protocol", ["nist", "insightface"])
def test_generic_metrics_align_weight_flip_and_score_as_computed_by_hand(ijbc112, tmp_path, protocol):
    import shutil

    root = tmp_path / "ijbc"
    shutil.copytree(ijbc112, root)
    shutil.copy(root / "landmarks.txt", root / "meta" / LANDMARKS_FILE)
    meta = read_ijbc_meta(root)
    assert meta.landmarks.shape == (len(meta.images), 5, 2) and meta.scores.shape == (len(meta.images),)
    torch.manual_seed(0)
    model = build_face_backbone("sphere4", 16, (112, 112))
    cfg = _cfg(
        ijbc_flip=True, ijbc_identification=protocol, far_targets=[0.1, 0.3], fpir_targets=[0.25, 0.5], ranks=[1, 2]
    )
    got = generic_metrics(model, meta, cfg, torch.device("cpu"))
    # by hand: landmarks at the template = identity alignment, so the crops are the images themselves
    x = torch.stack([FaceImages([Record(p, 0, 0)], face_transform(112))[0][0] for p in meta.images])
    with torch.no_grad():
        raw = (model(x) + model(torch.flip(x, dims=[3]))).double().numpy()  # F1: image + mirror
    weighted = raw * meta.scores[:, None]  # D1
    ids, tf = template_features(weighted, meta.templates, meta.medias)
    pos = {int(t): i for i, t in enumerate(ids)}
    s = np.array([tf[pos[a]] @ tf[pos[b]] for a, b, _ in meta.pairs])
    lab = meta.pairs[:, 2] == 1
    want = {f"TAR@FAR={a:g}": v for a, v in tar_at_far(s[lab], s[~lab], [0.1, 0.3]).items()}
    want |= ijbc_identification(ids, tf, meta, [0.25, 0.5], [1, 2], protocol)
    assert set(got) == set(want)
    for k in want:
        assert got[k] == pytest.approx(want[k], abs=1e-9), k
    assert ("G1+G2/rank-1" in got) == (protocol == "insightface") and ("mean/rank-1" in got) == (protocol == "nist")
    # and the weights were used: unweighted scoring is a different computation
    unweighted = generic_metrics(
        model,
        meta,
        _cfg(ijbc_flip=True, ijbc_detector_score=False, far_targets=[0.1, 0.3], fpir_targets=[0.25, 0.5], ranks=[1, 2]),
        torch.device("cpu"),
    )
    _, tf_u = template_features(raw, meta.templates, meta.medias)
    assert not np.allclose(tf, tf_u)
    assert set(unweighted) >= {"TAR@FAR=0.1", "mean/rank-1"}


def test_the_loader_aligns_loose_crops_by_their_landmarks(tmp_path):
    (tmp_path / "meta").mkdir()
    (tmp_path / "loose_crop").mkdir()
    t = similarity(1.9, 15.0, 25.0, 40.0)
    landmarks = apply(t, ARCFACE_TEMPLATE)
    Image.fromarray(blobs((280, 300), landmarks, 3.0)).save(tmp_path / "loose_crop" / "1.png")
    _write_meta(tmp_path, ["1.png"])
    (tmp_path / "meta" / LANDMARKS_FILE).write_text(
        "1.png " + " ".join(f"{v:.5f}" for v in landmarks.ravel()) + " 0.87\n"
    )
    meta = read_ijbc_meta(tmp_path)
    crop = np.asarray(IJBCImages(meta, 112).load(0))
    assert crop.shape == (112, 112, 3) and meta.scores.tolist() == [0.87]
    for want in ARCFACE_TEMPLATE:
        assert np.linalg.norm(centroid(crop, want) - want) < 1.0


def test_images_that_are_not_112_without_landmarks_are_refused(tmp_path):
    write_ijbc_layout(tmp_path, 2, probe_templates=1, media_per_template=1, images_per_media=1, size=32)
    meta = read_ijbc_meta(tmp_path)
    assert meta.landmarks is None
    with pytest.raises(UnalignedImageError) as e:
        IJBCImages(meta, 32)
    msg = str(e.value)
    assert "is 32x32" in msg and LANDMARKS_FILE in msg and "aligned 112x112 crops" in msg and "1.png" in msg
    # and a run with the default detector-score weighting refuses a folder without the scores
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="fedfr.ijbc_detector_score=false"):
        generic_metrics(build_face_backbone("sphere4", 16, (32, 32)), meta, _cfg(image_size=32), torch.device("cpu"))


def test_landmarks_file_errors_name_the_line(tmp_path):
    (tmp_path / "meta").mkdir()
    _write_meta(tmp_path, ["1.png", "2.png"])
    (tmp_path / "meta" / LANDMARKS_FILE).write_text("1.png " + " ".join(["1"] * 10) + " 0.9\n")
    with pytest.raises(ValueError, match="no line for 1 image.*'2.png'"):
        read_ijbc_meta(tmp_path)
    (tmp_path / "meta" / LANDMARKS_FILE).write_text("1.png 1 2 3 0.9\n")
    with pytest.raises(ValueError, match=r":1: expected '<image> x1 y1 ... x5 y5 <score>' \(12 fields\), found 5"):
        read_ijbc_meta(tmp_path)


def _write_meta(root, names):
    meta = root / "meta"
    meta.mkdir(exist_ok=True)
    (meta / "ijbc_face_tid_mid.txt").write_text("".join(f"{n} {i + 1} {i + 1}\n" for i, n in enumerate(names)))
    (meta / "ijbc_template_pair_label.txt").write_text("1 1 1\n")
    for name in ("ijbc_1N_gallery_G1.csv", "ijbc_1N_gallery_G2.csv", "ijbc_1N_probe_mixed.csv"):
        (meta / name).write_text("TEMPLATE_ID,SUBJECT_ID,FILENAME,SIGHTING_ID\n1,1,x,1\n")


def test_the_per_round_evaluator_refuses_at_construction(tmp_path):
    from server.fedfr.evaluate import GenericEvaluator

    write_ijbc_layout(tmp_path, 2, probe_templates=1, media_per_template=1, images_per_media=1, size=32)
    cfg = _cfg(image_size=32, ijbc_root=str(tmp_path))
    with pytest.raises(ValueError, match="ijbc_name_5pts_score.txt, which is missing"):
        GenericEvaluator(cfg, 3, torch.device("cpu"))
    cfg.fedfr.ijbc_detector_score = False
    with pytest.raises(UnalignedImageError, match="is 32x32"):
        GenericEvaluator(cfg, 3, torch.device("cpu"))
