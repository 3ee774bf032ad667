"""The committed study files: each loads at every scale, with claims, a plateau rule and five seeds."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.studies.fedstudy import STUDY_DIR, load_study, run_command

STUDIES = sorted(p.stem for p in STUDY_DIR.glob("*.yaml"))


@pytest.mark.parametrize("name", STUDIES)
def test_study_file_is_complete_at_every_scale(name, tmp_path):
    study = load_study(name)  # claims name known variants and metrics (checked on load)
    assert len(study["seeds"]) >= 5 and study["claims"] and study["plateau"]
    scales = ["", *sorted(load_study_scales(name))]
    assert {"paper", "smoke"} <= set(scales)
    for scale in scales:
        s = load_study(name, [f"scale={scale}"] if scale else [])
        pretrained = tmp_path / "w.pth" if s.get("pretrain") else None
        for variant in s["variants"]:
            cmd = run_command(s, variant, 0, tmp_path / "r", tmp_path / "d", pretrained)  # every placeholder filled
            assert not any("{" in c and "}" in c and "=" not in c for c in cmd), cmd
    paper = load_study(name, ["scale=paper"])
    assert any(o.startswith("engine.num_gpus=") for o in paper["overrides"])


def load_study_scales(name: str) -> list[str]:
    from omegaconf import OmegaConf

    return list(OmegaConf.load(Path(STUDY_DIR) / f"{name}.yaml").get("scales", {}))
