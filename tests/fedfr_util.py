"""Shared helpers of the FedFR tests: a tiny face world on disk and a tiny FedFR config (seconds, CPU)."""

from __future__ import annotations

from pathlib import Path

import torch

from client.site_settings import SiteSettings
from common.config.experiment import ExperimentConfig
from common.datasets.face_split import plan_split, read_identities, write_split
from common.datasets.synthetic_faces import write_identity_folders
from common.models.fedfr import expected_fedfr_manifest, fedfr_model
from common.params import get_shared

SIZE = 16  # image size of the tiny world


def tiny_world(
    root: Path,
    *,
    public: int = 6,
    sites: tuple[str, ...] = ("face1", "face2"),
    ids_per_site: int = 3,
    train: int = 4,
    test: int = 2,
) -> dict[str, Path]:
    """Synthetic identities split into public + sites (face_site folders); returns the roots."""
    n = public + len(sites) * ids_per_site
    write_identity_folders(root / "source", n, train + test, size=SIZE, seed=3)
    plan = plan_split(
        read_identities(root / "source"),
        num_public=public,
        num_clients=len(sites),
        ids_per_client=ids_per_site,
        train_per_id=train,
        test_per_id=test,
        seed=3,
    )
    plan.sites = dict(zip(sites, plan.sites.values()))
    write_split(plan, root / "split")
    return {"public": root / "split" / "public", **{s: root / "split" / "clients" / s for s in sites}}


def tiny_fedfr_config(roots: dict[str, Path], state: Path, **fedfr) -> ExperimentConfig:
    sites = [k for k in roots if k != "public"]
    f = {
        "backbone": "sphere4",
        "embedding_dim": 16,
        "image_size": SIZE,
        "public_root": str(roots["public"]),
        "batch_size": 4,
        "local_epochs": 1,
        "lr": 0.01,
        "pretrain_epochs": 1,
        "pretrain_batch_size": 8,
        "eval_sites": {s: {"data_root": str(roots[s]), "state_dir": str(state / s)} for s in sites},
        **fedfr,
    }
    return ExperimentConfig.from_dict(
        {
            "task": "fedfr",
            "sites": sites,
            "strategy": {"min_available_sites": len(sites)},
            "train": {"threads": 1},
            "eval": {"batch_size": 16},
            "fedfr": f,
        }
    )


def settings(roots: dict[str, Path], state: Path, site: str) -> SiteSettings:
    return SiteSettings(site=site, data_root=str(roots[site]), reader="face_site", state_dir=str(state / site))


def global_arrays(cfg: ExperimentConfig, num_public: int, seed: int) -> list:
    """Shared arrays [Theta, Phi] of a seeded random generic model."""
    torch.manual_seed(seed)
    return get_shared(fedfr_model(cfg.fedfr, num_public, 0), expected_fedfr_manifest(cfg.fedfr, num_public))
