"""The training loader: a site process keeps its workers across rounds, and a site trains the same
at num_workers=0 and 2, with and without the site process (both tasks), bit for bit."""

import dataclasses

import numpy as np
import psutil
import torch
from torch.utils.data import Dataset

from client.fedfr.client import FedFRClient
from client.fedreid.client import FedReIDClient
from client.runtime.round_loader import RoundLoader
from client.runtime.settings import SiteSettings
from common.models.fedfr import expected_fedfr_manifest
from tests.fakes import (
    FEDFR_PUBLIC,
    Unpacked,
    fedfr_arrays,
    fedfr_settings,
    fit_config,
    global_arrays,
    tiny_config,
    tiny_fedfr_config,
)


class Noisy(Dataset):
    """Item i: i plus two draws of torch's global generator (as the torchvision transforms draw)."""

    def __len__(self):
        return 10

    def __getitem__(self, i):
        return torch.rand(2) + i, i


def workers():
    """Pids of this process's children (a DataLoader's workers; fork start method)."""
    return {p.pid for p in psutil.Process().children(recursive=True)}


def batches(loader):
    return [(x.clone(), y.clone()) for x, y in loader]


def test_a_kept_loader_keeps_its_workers_and_gives_what_num_workers_0_gives():
    before = workers()
    kept = RoundLoader(Noisy(), batch_size=3, num_workers=2, persistent=True)
    plain = RoundLoader(Noisy(), batch_size=3, num_workers=0, persistent=True)  # no workers to keep
    pids, got = [], []
    for rnd, indices in ((1, range(10)), (2, [1, 4, 5, 8, 9])):
        a = batches(kept.round(rnd, indices, drop_last=rnd == 1))
        kept.finished()
        torch.manual_seed(123)  # what the main process drew before must not matter ...
        state = torch.get_rng_state()
        b = batches(plain.round(rnd, indices, drop_last=rnd == 1))
        plain.finished()
        assert torch.equal(torch.get_rng_state(), state)  # ... and the samples drew nothing from its generator
        pids.append(workers() - before)
        got.append(a)
        for (xa, ya), (xb, yb) in zip(a, b, strict=True):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
        ys = torch.cat([y for _, y in a]).tolist()
        assert len(ys) == len(set(ys)) == (9 if rnd == 1 else 5) and set(ys) <= set(indices)
    assert len(pids[0]) == 2 and pids[1] == pids[0]  # the same two worker processes in both rounds
    # round 2 of a new loader is round 2: nothing depends on the rounds before
    fresh = RoundLoader(Noisy(), batch_size=3, num_workers=0, persistent=False)
    for (xa, _), (xb, _) in zip(got[1], batches(fresh.round(2, [1, 4, 5, 8, 9], drop_last=False)), strict=True):
        assert torch.equal(xa, xb)
    # a round that did not finish (it failed half-way) leaves its workers behind: the next gets new ones
    next(iter(kept.round(3, range(10), drop_last=True)))
    batches(kept.round(4, range(10), drop_last=True))
    kept.finished()
    new = workers() - before
    assert len(new) == 2 and not new & pids[0]
    kept.close()  # a site process ending: its workers stop
    assert workers() - before == set()


def test_fedreid_site_trains_the_same_with_persistent_workers_and_without_a_site_process(tiny_site, tmp_path):
    before = workers()

    def site(name, hold, num_workers):
        cfg = tiny_config(train={"num_workers": num_workers, "keep_optimizer_state": True})
        s = SiteSettings(site="market1501", data_root=str(tiny_site), state_dir=str(tmp_path / name), hold_state=hold)
        return cfg, Unpacked(FedReIDClient(cfg, s))

    cfg, held = site("held", True, 2)
    pids = []
    for rnd in (1, 2):
        g = global_arrays(cfg, seed=rnd)
        a, _, ma = site("plain", False, 0)[1].fit(g, fit_config(cfg, rnd))  # per-message, num_workers=0
        b, _, mb = site("workers", False, 2)[1].fit(g, fit_config(cfg, rnd))  # per-message, 2 workers each round
        c, _, mc = held.fit(g, fit_config(cfg, rnd))  # a site process: its 2 workers kept
        pids.append(workers() - before)
        assert ma["loss"] == mb["loss"] == mc["loss"], rnd
        for x, y, z in zip(a, b, c):
            np.testing.assert_array_equal(x, y, err_msg=f"round {rnd}: num_workers 0 and 2")
            np.testing.assert_array_equal(x, z, err_msg=f"round {rnd}: persistent workers")
    assert len(pids[0]) == 2 and pids[1] == pids[0]
    held.client.close()


def test_fedfr_site_trains_the_same_with_persistent_workers_and_without_a_site_process(face_world, tmp_path):
    cfg = tiny_fedfr_config(face_world, tmp_path, t_hn=0.8, keep_optimizer_state=True)
    with_workers = tiny_fedfr_config(face_world, tmp_path, t_hn=0.8, keep_optimizer_state=True)
    with_workers.train.num_workers = 2
    held = Unpacked(
        FedFRClient(
            with_workers, dataclasses.replace(fedfr_settings(face_world, tmp_path / "held", "face1"), hold_state=True)
        )
    )
    conf = {"manifest_hash": expected_fedfr_manifest(cfg.fedfr, FEDFR_PUBLIC).hash}
    hard = []
    for rnd in (1, 2):
        g = fedfr_arrays(cfg, FEDFR_PUBLIC, rnd)
        a, _, ma = Unpacked(FedFRClient(cfg, fedfr_settings(face_world, tmp_path / "plain", "face1"))).fit(
            g, {**conf, "server_round": rnd}
        )
        b, _, mb = held.fit(g, {**conf, "server_round": rnd})
        assert ma["loss"] == mb["loss"] and ma["hard_negatives"] == mb["hard_negatives"], rnd
        hard.append(ma["hard_negatives"])
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y, err_msg=f"round {rnd}")
    # each round trained on its own subset of the public images (chosen by index from one dataset)
    assert 0 < hard[0] != hard[1] < FEDFR_PUBLIC * 6
    held.client.close()
