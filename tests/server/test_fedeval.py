"""fedeval: unseen-domain protocol (splits saved and reused), table files, numbers = per-split metric."""

import json

import numpy as np
import pytest
import torch

from common.checkpoint import save_global_checkpoint
from common.datasets import build_reader
from common.datasets.layouts import write_layout
from common.datasets.splits import load_splits
from common.evaluation.features import extract_features
from common.evaluation.reid import distance_matrix, evaluate_rank
from common.models.builder import expected_manifest, model_for
from common.params import get_shared
from server.studies import fedeval
from tests.fakes import tiny_config


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fedeval")
    cfg = tiny_config()
    torch.manual_seed(0)
    model = model_for(cfg, 1)
    man = expected_manifest(cfg)
    ckpt = tmp / "global_final.pt"
    save_global_checkpoint(
        ckpt,
        keys=list(man.keys),
        arrays=get_shared(model, man),
        server_round=3,
        manifest_hash=man.hash,
        config=cfg.to_dict(),
    )
    write_layout("viper", tmp / "data" / "viper", num_ids=10, images_per_id=2, seed=1, height=32, width=16)
    write_layout("market1501", tmp / "data" / "mkt", num_ids=6, images_per_id=4, seed=2, height=32, width=16)
    return tmp, cfg, model, ckpt


def test_fedeval_table_and_numbers(setup, capsys):
    tmp, cfg, model, ckpt = setup
    out = tmp / "out"
    with pytest.raises(SystemExit) as e:
        fedeval.main(
            [
                f"checkpoint={ckpt}",
                "targets=[viper,market]",
                f"data_root={tmp / 'data'}",
                "market.reader=market1501",
                f"market.root={tmp / 'data' / 'mkt'}",
                "splits=3",
                f"out={out}",
            ]
        )
    assert e.value.code == 0
    printed = capsys.readouterr().out
    assert "| checkpoint | VIPeR R1 | VIPeR mAP | market R1 |" in printed
    res = json.loads((out / "results.json").read_text())["results"][str(ckpt)]
    assert (out / "results.csv").read_text().startswith("checkpoint,VIPeR R1")
    assert (out / "results.md").is_file()

    # independent computation: per split, features -> distance -> evaluate_rank, then the mean
    splits = load_splits(out / "splits" / "viper_splits.json")
    assert len(splits) == 3
    kw = {"height": cfg.model.height, "width": cfg.model.width, "device": torch.device("cpu")}
    r1, ap = [], []
    for s in splits:
        assert len(s.query) == 5 and len({r.pid for r in s.query}) == 5  # half of 10 ids, one query each
        qf = extract_features(model.embedding, s.query, **kw)
        gf = extract_features(model.embedding, s.gallery, **kw)
        cmc, m = evaluate_rank(
            distance_matrix(qf, gf, "cosine"),
            np.array([r.pid for r in s.query]),
            np.array([r.pid for r in s.gallery]),
            np.array([r.camid for r in s.query]),
            np.array([r.camid for r in s.gallery]),
            max_rank=5,
        )
        r1.append(cmc[0])
        ap.append(m)
    assert res["viper/R1"] == pytest.approx(np.mean(r1), abs=1e-6)
    assert res["viper/mAP"] == pytest.approx(np.mean(ap), abs=1e-6)
    assert res["viper/R1_std"] == pytest.approx(np.std(r1), abs=1e-6)
    mk = build_reader("market1501", tmp / "data" / "mkt").splits
    qf = extract_features(model.embedding, mk.query, **kw)
    gf = extract_features(model.embedding, mk.gallery, **kw)
    cmc, m = evaluate_rank(
        distance_matrix(qf, gf, "cosine"),
        np.array([r.pid for r in mk.query]),
        np.array([r.pid for r in mk.gallery]),
        np.array([r.camid for r in mk.query]),
        np.array([r.camid for r in mk.gallery]),
        max_rank=10,
    )
    assert res["market/mAP"] == pytest.approx(m, abs=1e-6)
    assert res["mean/R1"] == pytest.approx((res["viper/R1"] + res["market/R1"]) / 2)

    # a second run reuses the saved splits (same numbers)
    with pytest.raises(SystemExit):
        fedeval.main([f"checkpoint={ckpt}", "targets=[viper]", f"data_root={tmp / 'data'}", "splits=3", f"out={out}"])
    again = json.loads((out / "results.json").read_text())["results"][str(ckpt)]
    assert again["viper/R1"] == res["viper/R1"]


def test_fedeval_errors(setup, tmp_path):
    tmp, _, _, ckpt = setup
    with pytest.raises(SystemExit, match="checkpoint=PATH is required"):
        fedeval.main(["targets=[viper]"])
    with pytest.raises(SystemExit, match="unknown option"):
        fedeval.main([f"checkpoint={ckpt}", "colour=blue"])
    with pytest.raises(SystemExit, match="checkpoint not found"):
        fedeval.main(
            [f"checkpoint={tmp_path / 'nope.pt'}", "targets=[viper]", f"data_root={tmp / 'data'}", f"out={tmp_path}"]
        )
