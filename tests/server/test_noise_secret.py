"""Noise no site can undo: the privacy noise is keyed by a per-run secret that no site receives.

A site receives the site view of the config (seed and beta included) and its FitIns (parameters
plus config). Before, the noise generators were seeded from (seed, round, purpose), so a site
regenerated every draw and subtracted it. Here the "attack" is run with everything a site
receives and must fail, while a resume from the checkpoint reproduces the noise exactly.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from common.config.experiment import ExperimentConfig
from common.config.run import ENV, serverapp_config, site_config, site_run_config, write_serverapp_config
from common.seeding import secret_rng, stable_seed
from server.deploy.resume import resume_config
from server.run.checkpoint import load_server_checkpoint, save_server_checkpoint
from server.run.folder import CHECKPOINT
from server.run.reporting import RoundReporter
from server.strategy.base import FedReIDStrategy, RoundRecord
from server.strategy.settings import run_noise_secret, settings_from_config
from tests.fakes import MAN, arrays, fit_res, manager_of, named_results, packed, tiny_config, unpacked

BETA = 0.1


def coordinator_config(tmp_path) -> ExperimentConfig:
    return tiny_config(
        seed=7,
        run_dir=str(tmp_path / "run"),
        rounds=2,
        privacy={"beta": BETA},
        coordinator_state_dir=str(tmp_path / "coordinator"),
        superlink={
            "address": "10.0.0.5:9092",
            "ca_cert": "/etc/fed/ca.crt",
            "cert": "/etc/fed/s.pem",
            "key": "/etc/fed/s.key",
            "node_auth": True,
            "site_keys": "/etc/fed/keys",
        },
        eval={"targets": {"viper": {"reader": "viper", "root": "/srv/eval/viper"}}},
    )


def build(cfg: ExperimentConfig, ck=None) -> FedReIDStrategy:
    # site names from the nodes' metrics (the key-registration table is another test's subject); no norm
    # bound: the aggregate is the plain mean (Eq. 8), so the noise on it is visible
    s = FedReIDStrategy(
        manifest=MAN,
        initial_arrays=arrays(0.0),
        settings=replace(settings_from_config(cfg, ck), wait_for_sites_s=1, site_nodes=None, norm_bound=0),
    )
    if ck is not None:
        s.restore_state(ck.strategy)
    return s


def what_a_site_receives(cfg: ExperimentConfig, strategy: FedReIDStrategy, rnd: int):
    """The site view of the config and the fit instructions of the run's round ``rnd`` (a resumed
    strategy counts Flower's rounds after its checkpoint's round)."""
    ins = strategy.configure_fit(rnd - strategy.round_offset, packed(arrays(1.0)), manager_of(cfg.sites))
    return site_config(site_run_config(cfg)), ins


def test_a_site_cannot_regenerate_the_noise_from_what_it_receives(tmp_path):
    cfg = coordinator_config(tmp_path)
    strategy = build(cfg)
    seen, ins = what_a_site_receives(cfg, strategy, rnd=1)
    assert seen.seed == 7 and seen.privacy.beta == BETA  # the site knows the seed and beta
    received = [unpacked(MAN, fit.parameters) for _, fit in ins]
    # the attack that worked before: regenerate the draws from the seed and subtract them (on the
    # tensors the manifest marks as noised)
    rng = np.random.default_rng(stable_seed(seen.seed, 1, "client-noise"))
    for got in received:
        guess = [
            a - seen.privacy.beta * rng.standard_normal(a.shape) if noised else a
            for a, noised in zip(got, MAN.noise_mask)
        ]
        err = np.concatenate([(g - t).ravel() for g, t in zip(guess, arrays(1.0))])
        assert np.abs(err).max() > 1e-3  # exact recovery would give ~1e-8 (float32 rounding)
    # the secret is in nothing a site receives
    secret = strategy.noise_secret
    assert len(secret) == 64 and int(secret, 16) >= 0
    carried = json.dumps(site_run_config(cfg)) + json.dumps([fit.config for _, fit in ins])
    assert secret not in carried and secret not in json.dumps(cfg.to_dict())
    # a fresh run draws a fresh secret: two runs with the same seed do not share their noise
    assert build(cfg).noise_secret != secret


def test_resume_from_the_checkpoint_reproduces_the_noise_exactly(tmp_path):
    cfg = coordinator_config(tmp_path)
    first = build(cfg)
    reporter = RoundReporter(cfg, None, list(MAN.keys), MAN.hash)
    reporter.strategy_state = first.checkpoint_state
    reporter(1, arrays(0.5), None, RoundRecord(1))  # the checkpoint after round 1
    reporter.flush()  # written on the reporter's writer thread
    ck = load_server_checkpoint(cfg.resolved_run_dir() / CHECKPOINT)
    assert run_noise_secret(cfg, ck) == (first.run_id, first.noise_secret)
    resumed = build(cfg, ck)
    for rnd in (2, 3):
        _, a = what_a_site_receives(cfg, first, rnd)
        _, b = what_a_site_receives(cfg, resumed, rnd)
        for (_, fa), (_, fb) in zip(a, b):
            for x, y in zip(unpacked(MAN, fa.parameters), unpacked(MAN, fb.parameters)):
                assert x.tobytes() == y.tobytes()
        agg = []
        for s in (first, resumed):
            replies = named_results(s, [fit_res(cfg.sites[0], arrays(1.0)), fit_res(cfg.sites[1], arrays(3.0))])
            agg.append(unpacked(MAN, s.aggregate_fit(rnd - s.round_offset, replies, [])[0]))
        agg_a, agg_b = agg
        assert all(x.tobytes() == y.tobytes() for x, y in zip(agg_a, agg_b))
        noise = np.concatenate([(x - 2.0).ravel() for x in agg_a])  # Eq. (14) on the mean 2.0
        assert 0 < np.abs(noise).max() < 10 * BETA
    # a run started afresh (no checkpoint) draws other noise
    _, c = what_a_site_receives(cfg, build(cfg), 2)
    _, a = what_a_site_receives(cfg, first, 2)
    assert unpacked(MAN, c[0][1].parameters)[0].tobytes() != unpacked(MAN, a[0][1].parameters)[0].tobytes()


def test_only_the_coordinators_own_folder_holds_the_secret(tmp_path):
    cfg = coordinator_config(tmp_path)
    cfg.rounds = 1
    s = build(cfg)
    reporter = RoundReporter(cfg, None, list(MAN.keys), MAN.hash)
    reporter.strategy_state = s.checkpoint_state
    reporter(1, arrays(0.5), None, RoundRecord(1))  # last round: also writes global_final.pt
    run_dir = cfg.resolved_run_dir()
    latest = run_dir / CHECKPOINT
    assert (run_dir / "global_final.pt").is_file() and latest.is_file()
    assert load_server_checkpoint(latest).strategy["run_id"] == s.run_id
    for f in run_dir.rglob("*"):  # the checkpoint included: a run folder may be handed over
        if f.is_file():
            assert s.noise_secret.encode() not in f.read_bytes(), f
    folder = tmp_path / "coordinator" / "noise"
    kept = folder / s.run_id
    assert kept.read_text() == s.noise_secret
    assert kept.stat().st_mode & 0o777 == 0o600 and folder.stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "coordinator").stat().st_mode & 0o777 == 0o700


def _checkpoint_after_round_1(cfg: ExperimentConfig) -> FedReIDStrategy:
    first = build(cfg)
    reporter = RoundReporter(cfg, None, list(MAN.keys), MAN.hash)
    reporter.strategy_state = first.checkpoint_state
    reporter(1, arrays(0.5), None, RoundRecord(1))
    reporter.flush()
    return first


def _aggregate(s: FedReIDStrategy, cfg: ExperimentConfig, rnd: int) -> list[np.ndarray]:
    replies = named_results(s, [fit_res(cfg.sites[0], arrays(1.0)), fit_res(cfg.sites[1], arrays(3.0))])
    return unpacked(MAN, s.aggregate_fit(rnd - s.round_offset, replies, [])[0])


def test_a_crafted_checkpoint_does_not_choose_the_resumed_noise(tmp_path):
    # whoever can write the run folder (docs/security.md: every handed file is hostile) puts a secret
    # of their choice into the checkpoint; if the resumed run used it, they would know every later
    # round's noise and subtract it from the released model
    cfg = coordinator_config(tmp_path)
    _checkpoint_after_round_1(cfg)
    path = cfg.resolved_run_dir() / CHECKPOINT
    ck = load_server_checkpoint(path)
    chosen = "ab" * 32
    ck.strategy["noise_secret"] = chosen
    save_server_checkpoint(path, ck)
    crafted = load_server_checkpoint(path)
    resumed = build(cfg, crafted)
    assert resumed.noise_secret != chosen
    # the noise the crafter predicts: Eq. (14) on the mean 2.0, drawn from the chosen secret
    rng = secret_rng(chosen, 2, "server-noise")
    predicted = [
        2.0 + BETA * rng.standard_normal(a.shape) if noised else None for a, noised in zip(arrays(0.0), MAN.noise_mask)
    ]
    got = _aggregate(resumed, cfg, 2)
    assert any(MAN.noise_mask)
    for g, p in zip(got, predicted):
        if p is not None:
            assert np.abs(g - p).max() > 1e-3  # the crafter's prediction is off by the noise's scale


def test_a_checkpoint_naming_a_run_this_coordinator_did_not_start_is_refused(tmp_path):
    cfg = coordinator_config(tmp_path)
    _checkpoint_after_round_1(cfg)
    path = cfg.resolved_run_dir() / CHECKPOINT
    ck = load_server_checkpoint(path)
    ck.strategy["run_id"] = "0" * 32  # a folder written elsewhere, or its run id changed
    ck.strategy["noise_secret"] = "cd" * 32
    save_server_checkpoint(path, ck)
    with pytest.raises(ValueError, match="did not write"):
        settings_from_config(cfg, load_server_checkpoint(path))
    (cfg.resolved_run_dir() / "config.json").write_text(json.dumps(cfg.to_dict()))
    with pytest.raises(ValueError, match="did not write"):  # fedserver resume=RUN_DIR refuses it before any process
        resume_config(cfg.resolved_run_dir(), [f"coordinator_state_dir={tmp_path / 'coordinator'}"])


def test_the_site_view_holds_no_coordinator_setting(tmp_path):
    cfg = coordinator_config(tmp_path)
    view = cfg.site_view()
    text = json.dumps(site_run_config(cfg))
    assert "superlink" not in view and "targets" not in view["eval"]
    for leak in ("/etc/fed", "10.0.0.5", "/srv/eval", str(tmp_path), "node_auth", "site_keys", "resume_from"):
        assert leak not in text, leak
    seen = site_config(site_run_config(cfg))  # what the ClientApp rebuilds: the same experiment
    assert seen.model == cfg.model and seen.train == cfg.train and seen.sites == cfg.sites
    assert seen.superlink.ca_cert is None and seen.superlink.site_keys is None


def test_the_site_view_names_none_of_the_coordinators_fedfr_folders():
    cfg = tiny_config(
        task="fedfr",
        fedfr={"public_root": "/srv/pub-faces", "pretrained": "/srv/pre.pt", "ijbc_root": "/srv/ijbc"},
    )
    view = cfg.site_view()
    assert {"public_root", "pretrained", "ijbc_root"}.isdisjoint(view["fedfr"])
    text = json.dumps(site_run_config(cfg))
    for leak in ("/srv/pub-faces", "/srv/pre.pt", "/srv/ijbc"):
        assert leak not in text, leak
    assert site_config(site_run_config(cfg)).fedfr.public_root == ""  # a site names its own copy


def test_virtual_sites_read_the_coordinators_public_data_unless_given_their_own(tmp_path):
    from server.deploy.simulation_engine import fill_virtual_sites

    sites = {
        "face1": {"reader": "face_site", "data_root": str(tmp_path / "f1"), "state_dir": str(tmp_path / "s1")},
        "face2": {
            "reader": "face_site",
            "data_root": str(tmp_path / "f2"),
            "state_dir": str(tmp_path / "s2"),
            "public_root": str(tmp_path / "own"),
        },
    }
    cfg = tiny_config(
        task="fedfr",
        sites=["face1", "face2"],
        fedfr={"public_root": str(tmp_path / "pub")},
        engine={"name": "simulation", "sites": sites},
    )
    filled = fill_virtual_sites(cfg)
    assert filled["face1"].public_root == str(tmp_path / "pub")
    assert filled["face2"].public_root == str(tmp_path / "own")


def test_the_serverapp_reads_the_whole_config_and_checks_the_run(tmp_path):
    cfg = coordinator_config(tmp_path)
    path = write_serverapp_config(tmp_path, cfg)
    assert path.stat().st_mode & 0o777 == 0o600
    got = serverapp_config(site_run_config(cfg), {ENV: str(path)})
    assert got.to_dict() == cfg.to_dict()
    other = tiny_config(seed=8)
    with pytest.raises(ValueError, match="not the site view"):
        serverapp_config(site_run_config(other), {ENV: str(path)})
    with pytest.raises(RuntimeError, match=ENV):
        serverapp_config(site_run_config(cfg), {})


def test_the_site_view_keeps_what_the_simulation_engines_virtual_sites_need():
    # engine=simulation: the virtual sites (Ray workers on the coordinator's machine) take their
    # reader, data root and state folder from the run config (client/flower/virtual_site.py)
    from client.flower.virtual_site import virtual_node_config

    sites = {
        "market1501": {"reader": "market1501", "data_root": "/d/m", "state_dir": "/s/m"},
        "dukemtmc": {"reader": "dukemtmc", "data_root": "/d/d", "state_dir": "/s/d"},
    }
    cfg = tiny_config(engine={"name": "simulation", "sites": sites})
    seen = site_config(site_run_config(cfg))
    assert virtual_node_config(seen, {"partition-id": 1, "num-partitions": 2}) == {
        "site": "dukemtmc",
        "data-root": "/d/d",
        "reader": "dukemtmc",
        "state-dir": "/s/d",
        "device": "cpu",
        "min-secure-aggregation-sites": "3",
    }


def test_an_empty_state_dir_means_the_environments_folder_else_the_home_folder(tmp_path, monkeypatch):
    from server.strategy import noise_secret

    monkeypatch.setenv(noise_secret.FOLDER_ENV, str(tmp_path / "from-env"))
    run_id, secret = noise_secret.new_run_secret("")
    assert (tmp_path / "from-env" / "noise" / run_id).read_text() == secret
    assert noise_secret.run_secret("", run_id) == secret
    monkeypatch.delenv(noise_secret.FOLDER_ENV)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    run_id, secret = noise_secret.new_run_secret("")
    assert (tmp_path / "home" / ".fedreid" / "coordinator" / "noise" / run_id).read_text() == secret
