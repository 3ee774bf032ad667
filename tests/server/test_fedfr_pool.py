"""FedFR's centralised row: every site's identities in one pooled site, the same images."""

from __future__ import annotations

import pytest

from server.demos.fedfr_demo import parse_args, pool_face_sites


def _site(root, ids, images=2):
    for part, n in (("train", images), ("test", 1)):
        for ident in ids:
            (root / part / ident).mkdir(parents=True)
            for i in range(n):
                (root / part / ident / f"{i}.png").write_bytes(f"{ident}{part}{i}".encode())
    return root


def test_pooled_site_holds_every_sites_identities_and_images(tmp_path):
    a, b = _site(tmp_path / "a", ["id1", "id2"]), _site(tmp_path / "b", ["id3"])
    pooled = pool_face_sites([a, b], tmp_path / "pooled")
    assert sorted(p.name for p in (pooled / "train").iterdir()) == ["id1", "id2", "id3"]
    assert sorted(p.name for p in (pooled / "test").iterdir()) == ["id1", "id2", "id3"]
    assert (pooled / "train" / "id3" / "1.png").read_bytes() == b"id3train1"
    assert len(list((pooled / "train").rglob("*.png"))) == 6 and len(list((pooled / "test").rglob("*.png"))) == 3
    assert pool_face_sites([a, b], tmp_path / "pooled") == pooled  # written once


def test_pooling_refuses_an_identity_in_two_sites_and_needs_the_simulation_engine(tmp_path):
    a, b = _site(tmp_path / "a", ["id1"]), _site(tmp_path / "b", ["id1"])
    with pytest.raises(SystemExit, match="identity id1 is in two sites"):
        pool_face_sites([a, b], tmp_path / "pooled")
    with pytest.raises(SystemExit, match="add --engine simulation"):
        parse_args(["--pool-sites"])
    a_, _ = parse_args(["--pool-sites", "--engine", "simulation", "--sites", "3"])
    assert a_.pool_sites and len(a_.sites) == 3


def test_the_pooled_model_is_scored_on_every_sites_own_protocol(tmp_path):
    from server.demos.fedfr_demo import _scored_on_sites

    a, overrides = parse_args(["--pool-sites", "--engine", "simulation", "--sites", "2", "rounds=1"])
    roots = {
        "public": tmp_path / "pub",
        "ijbc": tmp_path / "ijbc",
        "face01": tmp_path / "f1",
        "face02": tmp_path / "f2",
    }
    a.sites = ["pooled"]  # what main trains
    args = _scored_on_sites(["face01", "face02"], a, tmp_path, roots, [], overrides)
    assert "sites=[face01,face02]" in args and "rounds=1" in args
    assert f"++fedfr.eval_sites.face02.data_root={tmp_path / 'f2'}" in args
    assert not any(x.startswith(("sites=[pooled", "++fedfr.eval_sites.pooled")) for x in args)
