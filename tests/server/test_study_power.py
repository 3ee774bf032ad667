"""The evaluation sets a study sizes for power: more target domains, identities and queries per identity."""

from __future__ import annotations

import pytest

from common.datasets import build_reader
from server.demos.fedreid_demo import target_domains, write_data
from server.studies.stats import rate_standard_error


def test_target_domains_extend_the_two_demo_targets():
    assert target_domains(2) == {"synth_a": ("market1501", 101), "synth_b": ("market1501", 102)}
    assert list(target_domains(4)) == ["synth_a", "synth_b", "synth_c", "synth_d"]
    with pytest.raises(ValueError, match="expected 1..26, found 0"):
        target_domains(0)


def test_more_queries_per_identity_and_more_targets(tmp_path):
    roots = write_data(
        tmp_path,
        ["s1"],
        train_ids=2,
        images_per_id=4,
        target_ids=5,
        targets=3,
        target_images_per_id=8,
        queries_per_id=3,
    )
    assert {"synth_a", "synth_b", "synth_c"} <= set(roots)
    for name in ("synth_a", "synth_b", "synth_c"):
        splits = build_reader(*roots[name]).splits
        per_id: dict = {}
        for r in splits.query:
            per_id.setdefault(r.pid, set()).add(r.camid)
        assert len(per_id) == 5 and all(len(cams) == 3 for cams in per_id.values())  # 3 cameras each
        assert len(splits.query) == 15
        gallery = {r.pid for r in splits.gallery if r.pid > 0}
        assert gallery == set(per_id)  # every queried identity has gallery images
    # 400 identities x 3 queries: R1's binomial standard error at most 1.5 points even at R1 = 50 %
    assert rate_standard_error(0.5, 400 * 3) <= 0.015


def test_ijbc_style_impostor_pairs_grow_as_twice_s_times_s_minus_one(tmp_path):
    from common.datasets.synthetic_faces import write_ijbc_layout

    write_ijbc_layout(tmp_path, 5, size=16, seed=0)
    labels = [
        int(line.split()[2])
        for line in (tmp_path / "meta" / "ijbc_template_pair_label.txt").read_text().split("\n")
        if line
    ]
    # one gallery template and two probe templates per subject: 5 x 10 pairs, 2 x 5 genuine
    assert labels.count(1) == 2 * 5 and labels.count(0) == 2 * 5 * 4
    # fedfr-ablation's 250 subjects: TAR@FAR=1e-4 rests on at least 10 impostor pairs above its threshold
    assert 2 * 250 * 249 * 1e-4 >= 10
