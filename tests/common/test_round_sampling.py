"""A round's batches and each sample's augmentation come from the round's seed alone."""

import pytest
import torch
from torch.utils.data import Dataset

from common.datasets.round_sampling import RoundBatches, SeededSamples
from common.datasets.transforms import train_transform
from common.seeding import stable_seed


class Draws(Dataset):
    """Item i: i plus three draws of torch's global generator (as a torchvision transform draws)."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.rand(3) + i


def by_hand(seed: int, i: int) -> torch.Tensor:
    return torch.rand(3, generator=torch.Generator().manual_seed(stable_seed(seed, i))) + i


def test_a_sample_is_drawn_from_its_own_seed_whatever_was_drawn_before_and_leaves_the_global_stream():
    ds = SeededSamples(Draws())
    torch.manual_seed(1)
    state = torch.get_rng_state()
    a = [ds[(77, i)] for i in (3, 0, 5)]
    assert torch.equal(torch.get_rng_state(), state)  # the caller's stream is untouched
    torch.manual_seed(2)
    b = [ds[(77, i)] for i in (5, 3, 0)]  # another order, another global state
    for x, (j, y) in zip(a, [(3, b[1]), (0, b[2]), (5, b[0])], strict=True):
        assert torch.equal(x, y) and torch.equal(x, by_hand(77, j))
    assert not torch.equal(ds[(78, 3)], a[0])  # another pass: another augmentation
    assert len(ds) == 8


def test_two_views_of_a_reid_image_differ_and_repeat_under_the_same_key():
    from PIL import Image

    img = Image.fromarray(torch.arange(32 * 16 * 3, dtype=torch.uint8).reshape(32, 16, 3).numpy())
    tf = train_transform(32, 16)

    class TwoViews(Dataset):
        def __len__(self):
            return 1

        def __getitem__(self, i):
            return tf(img), tf(img)

    ds = SeededSamples(TwoViews())
    views = {tuple(map(lambda v: v.sum().item(), ds[(s, 0)])) for s in range(40)}
    a, b = ds[(5, 0)]
    c, d = ds[(5, 0)]
    assert torch.equal(a, c) and torch.equal(b, d)
    assert any(x != y for x, y in views)  # the two views are separate draws (flip, crop offsets)
    assert len(views) > 5


def test_round_batches_permute_the_round_indices_anew_in_each_pass_from_the_round_seed():
    rb = RoundBatches(3)
    with pytest.raises(RuntimeError, match="call start_round"):
        list(rb)
    indices = [2, 3, 5, 7, 11, 13, 17]
    rb.start_round(9, indices, drop_last=False)
    p1, p2 = list(rb), list(rb)
    g = torch.Generator().manual_seed(9)  # by hand: pass p is the p-th permutation of the round's generator
    for p, batches in ((1, p1), (2, p2)):
        order = [indices[j] for j in torch.randperm(7, generator=g).tolist()]
        assert [len(b) for b in batches] == [3, 3, 1] and len(rb) == 3
        assert [i for b in batches for _, i in b] == order
        assert {s for b in batches for s, _ in b} == {stable_seed(9, p)}
    assert p1 != p2
    rb.start_round(9, indices, drop_last=True)  # the same round again: the same batches
    again = list(rb)
    assert again == p1[:2] and len(rb) == 2
    rb.start_round(10, indices, drop_last=True)
    assert list(rb) != again
    with pytest.raises(ValueError, match="batch_size: expected >= 1, found 0"):
        RoundBatches(0)
