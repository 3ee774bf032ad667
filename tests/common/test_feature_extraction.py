"""The one feature-extraction loop (common/evaluation/features.py), Re-ID and face wrappers alike:
features equal the model applied to each image alone, in record order, flip rules and normalisation
as each task defines them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from common.datasets.base import Record
from common.datasets.face_images import face_transform
from common.datasets.image_dataset import read_image
from common.datasets.transforms import test_transform as reid_transform
from common.evaluation.features import embed, embed_chunks, extract_features, feature_chunks

CPU = torch.device("cpu")


class Linear(nn.Module):
    """A fixed linear map of the flattened image, not mirror-symmetric (so the flip rule shows)."""

    def __init__(self, pixels: int, dim: int = 5):
        super().__init__()
        torch.manual_seed(3)
        self.fc = nn.Linear(pixels, dim)
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


def _records(tmp_path, n: int, size: tuple[int, int]) -> list[Record]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        p = tmp_path / f"{i}.png"
        Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(p)
        out.append(Record(str(p), i, 0))
    return out


def _one_by_one(model: nn.Module, records, transform, flip: str | None, normalize: bool) -> np.ndarray:
    rows = []
    with torch.no_grad():
        for r in records:
            x = transform(read_image(r.path))
            f = model(x[None])[0].double().numpy()
            m = model(torch.flip(x, dims=[2])[None])[0].double().numpy()  # mirror along W of (3, H, W)
            f = {None: f, "mean": (f + m) / 2, "sum": f + m}[flip]
            rows.append(f / np.linalg.norm(f) if normalize else f)
    return np.stack(rows)


@pytest.mark.parametrize("flip", [False, True])
@pytest.mark.parametrize("normalize", [True, False])
def test_reid_features_are_the_mean_with_the_mirror_in_record_order(tmp_path, flip, normalize):
    records = _records(tmp_path, 7, (16, 8))
    model = Linear(3 * 16 * 8)
    got = extract_features(model, records, height=16, width=8, device=CPU, batch_size=3, flip=flip, normalize=normalize)
    want = _one_by_one(model, records, reid_transform(16, 8), "mean" if flip else None, normalize)
    assert got.dtype == np.float32 and got.shape == (7, 5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("flip", [False, True])
@pytest.mark.parametrize("normalize", [True, False])
def test_face_features_are_the_sum_with_the_mirror_in_record_order(tmp_path, flip, normalize):
    records = _records(tmp_path, 5, (12, 12))
    model = Linear(3 * 8 * 8)
    kw = {"image_size": 8, "batch_size": 2, "device": CPU, "flip": flip, "normalize": normalize}
    chunks = list(embed_chunks(model, records, **kw))
    assert [len(c) for c in chunks] == [2, 2, 1]  # one chunk per batch
    want = _one_by_one(model, records, face_transform(8), "sum" if flip else None, normalize)
    np.testing.assert_allclose(np.concatenate(chunks), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(embed(model, records, **kw), np.concatenate(chunks))


def test_unnormalised_sum_is_twice_the_mean_and_normalised_they_agree_bit_for_bit(tmp_path):
    from common.datasets.image_dataset import ImageDataset

    records = _records(tmp_path, 4, (16, 8))
    model = Linear(3 * 16 * 8)
    data = ImageDataset(records, reid_transform(16, 8))

    def run(flip, normalize):
        kw = {"batch_size": 4, "device": CPU, "normalize": normalize, "flip": flip}
        return np.concatenate(list(feature_chunks(model, data, **kw)))

    np.testing.assert_array_equal(run("sum", False), 2 * run("mean", False))  # halving is exact
    np.testing.assert_array_equal(run("sum", True), run("mean", True))
    with pytest.raises(ValueError, match="flip: expected None, 'mean' or 'sum', found 'max'"):
        run("max", True)


def test_empty_record_lists(tmp_path):
    model = Linear(3 * 16 * 8)
    assert extract_features(model, [], height=16, width=8, device=CPU).shape == (0, 5)
    assert embed(model, [], image_size=8, batch_size=2, device=CPU).shape == (0, 0)
