"""A FedFR site scores its personalised model where its data is (Flower's evaluate round): the figures
equal a brute-force computation and the offline scorer's, nothing but metrics leaves the site."""

import dataclasses
import os

import pytest
import torch
from torch import nn

from client.fedfr.client import FedFRClient
from client.fedfr.state import FEDFR_STATE
from common.datasets.face_folder import FaceFolder, FaceSite
from common.evaluation.fedfr_site_scoring import reply_keys
from common.models.fedfr import expected_fedfr_manifest, fedfr_model
from common.params import to_wire
from server.fedfr.evaluate import eval_sites, personalised_metrics
from tests.fakes import Unpacked, fedfr_arrays, fedfr_settings, tiny_fedfr_config, tiny_world
from tests.fedfr_brute_force import brute_force_model

PUBLIC = 6
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny world of three sites, each trained one round from the same global model."""
    root = tmp_path_factory.mktemp("fedfr_eval")
    world = tiny_world(root / "w", public=PUBLIC, sites=("face1", "face2", "face3"), ids_per_site=3, train=3, test=4)
    cfg = tiny_fedfr_config(world, root / "state", t_hn=0.0)
    arrays = fedfr_arrays(cfg, PUBLIC, 0)
    config = {"server_round": 1, "manifest_hash": expected_fedfr_manifest(cfg.fedfr, PUBLIC).hash}
    for site in cfg.sites:
        Unpacked(FedFRClient(cfg, fedfr_settings(world, root / "state", site))).fit(arrays, config)
    return world, cfg, root / "state", arrays, config


def site(world, cfg, state, name, impostors=()):
    settings = dataclasses.replace(
        fedfr_settings(world, state, name), impostor_roots=os.pathsep.join(str(world[o]) for o in impostors)
    )
    return FedFRClient(cfg, settings)


def models_of(cfg, state, name, arrays):
    """The site's models as the test builds them: from its state file and the global arrays."""
    st = FEDFR_STATE.load(state / name)
    m = fedfr_model(cfg.fedfr, PUBLIC, st.num_local)
    m.load_state_dict(st.model)
    g = fedfr_model(cfg.fedfr, PUBLIC, 0)
    g.load_state_dict(
        dict(zip(expected_fedfr_manifest(cfg.fedfr, PUBLIC).keys, map(torch.from_numpy, arrays))), strict=False
    )
    return {"global": g.backbone, "local": m.backbone, "personal": nn.Sequential(m.backbone, m.dfc.transform)}


def test_the_site_scores_its_three_models_as_brute_force_does(trained):
    world, cfg, state, arrays, config = trained
    c = site(world, cfg, state, "face2", impostors=("face1", "face3"))
    loss, n, metrics = c.evaluate(to_wire(c.manifest, arrays), config)
    own = FaceSite(world["face2"])
    assert (loss, n, metrics["site"]) == (0.0, len(own.test), "face2")
    assert set(metrics) - {"site"} == set(reply_keys(cfg.fedfr))  # every figure of every model, nothing else
    assert metrics["impostor_images"] == 2 * 3 * 4 and metrics["genuine_pairs"] == 3 * 6  # 3 ids x C(4, 2)
    kw = {"image_size": cfg.fedfr.image_size, "batch_size": 16, "device": CPU}
    others = [r for o in ("face1", "face3") for r in FaceSite(world[o]).test]
    for row, model in models_of(cfg, state, "face2", arrays).items():
        bf = brute_force_model(model, own, others, cfg.fedfr.far_targets, **kw)
        assert bf["genuine_pairs"] == metrics["genuine_pairs"]
        assert metrics[f"{row}/rank-1"] == bf["rank-1"], row
        for k in (f"TAR@FAR={a:g}" for a in cfg.fedfr.far_targets):
            # one genuine pair at most may sit on the float32 threshold differently
            assert metrics[f"{row}/{k}"] == pytest.approx(bf[k], abs=1.01 / bf["genuine_pairs"]), (row, k)


def test_the_site_figures_equal_the_offline_scorers_on_one_machine(trained):
    """The offline scorer of a one-machine run (every site's data readable) gives the same numbers."""
    world, cfg, state, arrays, config = trained
    sites = eval_sites(cfg)
    per_model = {row: [] for row in ("global", "local", "personal")}
    for s in cfg.sites:
        for row, m in models_of(cfg, state, s, arrays).items():
            per_model[row].append(m)
    for name in cfg.sites:
        c = site(world, cfg, state, name, impostors=[o for o in cfg.sites if o != name])
        _, _, metrics = c.evaluate(to_wire(c.manifest, arrays), config)
        for row, models in per_model.items():
            _, offline = personalised_metrics(models, sites, cfg, CPU)
            for k, v in offline[name].items():
                assert metrics[f"{row}/{k}"] == v, (name, row, k)


def test_without_impostor_folders_the_public_images_are_the_non_mated_probes(trained):
    world, cfg, state, arrays, config = trained
    c = site(world, cfg, state, "face1")
    _, _, metrics = c.evaluate(to_wire(c.manifest, arrays), config)
    assert metrics["impostor_images"] == len(FaceFolder(world["public"]).records)
    assert 0.0 <= metrics["personal/rank-1"] <= 1.0


def test_a_site_without_a_trained_state_scores_the_global_model_only(trained, tmp_path):
    world, cfg, _, arrays, config = trained
    c = site(world, cfg, tmp_path / "fresh", "face1", impostors=("face2",))
    _, _, metrics = c.evaluate(to_wire(c.manifest, arrays), config)
    assert {k.split("/")[0] for k in metrics if "/" in k} == {"global"}


def test_an_evaluation_of_another_model_is_refused(trained):
    world, cfg, state, arrays, config = trained
    c = site(world, cfg, state, "face1")
    with pytest.raises(ValueError, match="manifest"):
        c.evaluate(to_wire(c.manifest, arrays), {**config, "manifest_hash": "0" * 16})
