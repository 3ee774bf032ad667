"""Target images decoded once (common/evaluation/decoded_images.py): the same tensors as the Re-ID test
transform on the files, bit for bit; the evaluator keeps them across calls only within its memory cap."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from common.datasets import transforms
from common.datasets.base import Record
from common.datasets.image_dataset import ImageDataset
from common.evaluation.decoded_images import DecodedImages, decoded_bytes
from common.evaluation.targets import TargetSet
from server.fedreid.evaluate import ReIDEvaluator
from tests.fakes import tiny_config

H, W = 32, 16


def _images(tmp_path, n: int = 8) -> list[Record]:
    """Images of several sizes and formats (JPEG, PNG, a grey one), each pid twice over two cameras."""
    rng = np.random.default_rng(3)
    records = []
    for i in range(n):
        h, w = int(rng.integers(40, 160)), int(rng.integers(20, 80))
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        image = Image.fromarray(pixels).convert("L") if i == 5 else Image.fromarray(pixels)
        path = tmp_path / f"{i:02d}.{'png' if i % 2 else 'jpg'}"
        image.save(path)
        records.append(Record(str(path), i // 2, i % 2))
    return records


def test_decoded_items_equal_the_test_transform_of_the_files_bit_for_bit(tmp_path):
    records = _images(tmp_path)
    decoded, read = DecodedImages(records, H, W), ImageDataset(records, transforms.test_transform(H, W))
    assert len(decoded) == len(read) == len(records)
    for i in range(len(records)):
        (a, pid_a, cam_a), (b, pid_b, cam_b) = decoded[i], read[i]
        assert a.dtype == b.dtype == torch.float32 and a.shape == b.shape == (3, H, W)
        assert torch.equal(a, b), (i, (a - b).abs().max())
        assert (pid_a, cam_a) == (pid_b, cam_b) == (records[i].pid, records[i].camid)
    assert decoded.pixels.nbytes == decoded_bytes(len(records), H, W) == len(records) * H * W * 3


class MeanColour(nn.Module):
    """An embedding whose feature is the image's mean per channel and its mean per row band."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x.mean(dim=(2, 3)), x.mean(dim=(1, 3)).reshape(x.shape[0], 4, -1).mean(2)], dim=1)


def _target(records) -> TargetSet:
    q = np.array([0, 2, 4, 6])
    return TargetSet("t", records, [(q, np.setdiff1d(np.arange(len(records)), q))])


@pytest.mark.parametrize("keep_mb", [0.0, 1.0])
def test_the_evaluator_scores_the_same_and_reads_the_files_once_when_they_fit(tmp_path, keep_mb):
    records = _images(tmp_path)
    kw = {"height": H, "width": W, "device": torch.device("cpu"), "max_rank": 4}
    reference = ReIDEvaluator([_target(records)], **kw)(MeanColour())  # read at every call
    evaluator = ReIDEvaluator([_target(records)], keep_decoded_mb=keep_mb, **kw)
    assert evaluator(MeanColour()) == reference
    for r in records:  # the files are gone: only kept images can still be scored
        (tmp_path / r.path).unlink()
    if keep_mb:
        assert evaluator(MeanColour()) == reference
    else:
        with pytest.raises(OSError, match="cannot read image"):
            evaluator(MeanColour())


def test_targets_above_the_cap_are_read_again_at_every_call(tmp_path):
    records = _images(tmp_path)
    need_mb = decoded_bytes(len(records), H, W) / 2**20
    evaluator = ReIDEvaluator(
        [_target(records)], height=H, width=W, device=torch.device("cpu"), keep_decoded_mb=need_mb / 2
    )
    evaluator(MeanColour())
    (tmp_path / records[0].path).unlink()
    with pytest.raises(OSError, match="cannot read image"):
        evaluator(MeanColour())


@pytest.mark.parametrize("bad", [-1, float("inf"), "lots"])
def test_a_negative_or_unbounded_cap_is_refused_in_one_line(bad):
    with pytest.raises(ValueError, match="eval.keep_decoded_mb") as e:
        tiny_config(eval={"keep_decoded_mb": bad})
    assert "\n" not in str(e.value)
