"""FedFR evaluation: the generic model on IJB-C (1:1, 1:N) and the personalised models per site.

``fedfr_eval_main(cfg)`` (what ``fedeval task=fedfr ...`` calls) reports, for ``cfg.run_dir``:

    pretrained Theta_g^0        fedfr.pretrained (default <run_dir>/pretrained.pt)
    FedFR Theta_g               <run_dir>/global_final.pt (else global_latest.pt)
    local Theta_l               each site's backbone (diagnostic: no DFC)       } scored by the sites
    personalised [Theta_l, Pi_l]  each site's personalised model f' = Pi(Theta_l(x)) } themselves

the generic models on the generic protocol (``fedfr.ijbc_root``), and every model on the
personalised one: the sites' own figures of the run's last round (``fedfr_site_eval.json``,
``server/fedfr/site_evaluation.py``: the sites score in Flower's evaluate round, nothing here reads
a site's state), and, for a generic model the sites did not score, the same site-side scoring code
(``common/evaluation/fedfr_site_scoring.py``) on the sites' data folders when this machine has them
(a one-machine run: ``fedfr.eval_sites`` or ``conf/site/<site>.yaml``). It prints both tables and
writes ``fedfr_eval.{json,md}`` and ``fedfr_eval_{generic,personalised}.csv`` into the run folder.
Protocols: ``common.evaluation.fedfr_protocols``.

    fedeval task=fedfr run_dir=runs/fedfr-demo       (the run's config.json, written by fedserver)
    python -m server.fedfr.evaluate run_dir=RUN [KEY=VALUE ...]   (the same; KEY=VALUE overrides it)
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from common.checkpoint import UnsafeCheckpointError, atomic_json_save, atomic_write_bytes, torch_load
from common.config.experiment import ExperimentConfig
from common.config.fedfr import FedFRConfig
from common.datasets.face_folder import FaceSite
from common.datasets.ijbc import LANDMARKS_FILE, IJBCMeta, read_ijbc_meta
from common.datasets.ijbc_images import IJBCImages
from common.evaluation.features import embed, embed_dataset_chunks
from common.evaluation.fedfr_protocols import (
    generic_headline,
    ijbc_identification,
    ijbc_verification,
    mean_over_sites,
    template_features,
)
from common.evaluation.fedfr_site_scoring import score_site
from common.models.fedfr import FedFRModel, expected_fedfr_manifest, fedfr_model
from common.params import set_shared
from server.fedfr.pretrain import load_pretrained, pretrained_path
from server.fedfr.site_evaluation import SITE_EVAL_FILE

log = logging.getLogger("fedserver")


class GenericEvaluator:
    """IJB-C 1:1 and 1:N of one set of shared arrays [Theta_g, Phi_g] (the per-round hook)."""

    def __init__(self, cfg: ExperimentConfig, num_public: int, device: torch.device):
        self.cfg, self.f, self.device = cfg, cfg.fedfr, device
        self.meta = read_ijbc_meta(self.f.ijbc_root)
        check_generic_protocol(self.meta, self.f)  # a missing landmarks file stops fedserver at start-up
        IJBCImages(self.meta, self.f.image_size)  # as do loose crops without landmarks to align them
        self.model = fedfr_model(self.f, num_public, 0)
        self.manifest = expected_fedfr_manifest(self.f, num_public)

    def __call__(self, arrays: list[np.ndarray]) -> dict[str, float]:
        set_shared(self.model, self.manifest, arrays)
        m = generic_metrics(self.model.backbone, self.meta, self.cfg, self.device)
        out = {f"ijbc/{k}": v for k, v in generic_headline(m).items()}
        if "ijbc/rank-1" in out:
            out["ijbc/R1"] = out["ijbc/rank-1"]  # the key the round line and curves.png show
        return out


def generic_metrics(
    backbone: nn.Module, meta: IJBCMeta, cfg: ExperimentConfig, device: torch.device
) -> dict[str, float]:
    """TAR@FAR (1:1) and TPIR@FPIR / rank-k (1:N, ``fedfr.ijbc_identification``) of ``backbone``.

    Images aligned by their landmarks (or aligned 112x112 crops), raw features (their norm acts as
    a quality weight, insightface's N1), x the detector score when ``fedfr.ijbc_detector_score``,
    + the mirror's feature when ``fedfr.ijbc_flip``; then template-pooled and normalised.
    """
    f = cfg.fedfr
    check_generic_protocol(meta, f)
    chunks = embed_dataset_chunks(
        backbone,
        IJBCImages(meta, f.image_size),
        batch_size=cfg.eval.batch_size,
        device=device,
        num_workers=cfg.train.num_workers,
        normalize=False,
        flip=f.ijbc_flip,
    )
    feats = np.concatenate(list(chunks))
    weights = meta.scores if f.ijbc_detector_score else None
    ids, tfeats = template_features(feats, meta.templates, meta.medias, weights)
    out = {f"TAR@FAR={a:g}": v for a, v in ijbc_verification(ids, tfeats, meta.pairs, f.far_targets).items()}
    return out | ijbc_identification(ids, tfeats, meta, f.fpir_targets, f.ranks, f.ijbc_identification)


def check_generic_protocol(meta: IJBCMeta, f: FedFRConfig) -> None:
    """Detector-score weighting needs the scores: refuse (before any model work) when they are missing."""
    if f.ijbc_detector_score and meta.scores is None:
        root = Path(meta.images[0]).parent.parent if meta.images else Path(f.ijbc_root)
        raise ValueError(
            f"fedfr.ijbc_detector_score=true weights IJB-C features by the detector scores of "
            f"{root}/meta/{LANDMARKS_FILE}, which is missing; add that file (the IJB-C release has it) or "
            "set fedfr.ijbc_detector_score=false to score aligned 112x112 crops unweighted"
        )


def generic_protocol(meta: IJBCMeta, f: FedFRConfig) -> dict[str, object]:
    """How the generic numbers were computed (written next to them)."""
    return {
        "alignment": f"5-point similarity to the ArcFace template ({meta.landmarks_file})"
        if meta.landmarks is not None
        else "none: aligned 112x112 crops",
        "detector_score": bool(f.ijbc_detector_score),
        "flip": bool(f.ijbc_flip),
        "identification": f.ijbc_identification,
        "tar_at_far": "exact: smallest threshold with FAR <= target",
    }


@dataclass
class EvalSite:
    name: str
    data: FaceSite


def eval_sites(cfg: ExperimentConfig) -> list[EvalSite]:
    """Every site's data folder on this machine (``fedfr.eval_sites``, else ``conf/site/<site>.yaml``)."""
    from common.config.site import load_site

    out = []
    for s in cfg.sites:
        d = cfg.fedfr.eval_sites.get(s) or dataclasses.asdict(load_site(s))
        out.append(EvalSite(s, FaceSite(d["data_root"])))
    return out


def personalised_metrics(
    models: Sequence[nn.Module] | nn.Module, sites: list[EvalSite], cfg: ExperimentConfig, device: torch.device
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Mean over sites and per-site metrics, by the sites' own scoring code with every site's test
    images as the others' non-mated probes; ``models``: one per site, or one for all (each image
    set is then embedded once)."""
    f = cfg.fedfr
    kw = {"image_size": f.image_size, "batch_size": cfg.eval.batch_size, "device": device}
    shared = isinstance(models, nn.Module)
    cache: dict[tuple[int, int], np.ndarray] = {}

    def embed_fn(model: nn.Module, records) -> np.ndarray:
        key = (id(model), id(records))
        if key not in cache:
            cache[key] = embed(model, records, **kw)
        return cache[key]

    per_site = {}
    for i, s in enumerate(sites):
        model = models if shared else models[i]
        others = [t.data.test for j, t in enumerate(sites) if j != i]
        per_site[s.name] = score_site({"m": model}, s.data, others, i, f, embed_fn)["m"]
        if not shared:
            cache.clear()  # a site's own model embeds every site's probes once
    return mean_over_sites(per_site), per_site


def sites_report(run_dir: Path, sites: list[str], final_round: int | None) -> dict | None:
    """The sites' own figures of the run's last round (``fedfr_site_eval.json``), or None (with a
    line saying why) when there are none for these sites and this model."""
    path = run_dir / SITE_EVAL_FILE
    if not path.is_file():
        print(f"fedeval: no {SITE_EVAL_FILE} in {run_dir}: the sites reported no personalised figures", flush=True)
        return None
    report = json.loads(path.read_text())
    if sorted(report.get("sites", [])) != sorted(sites) or report.get("round") != final_round:
        print(
            f"fedeval: {path} holds the figures of sites {report.get('sites')} after round {report.get('round')}, "
            f"not of sites {sorted(sites)} after the final model's round {final_round}: not reported",
            flush=True,
        )
        return None
    return report


def load_global(path: Path, f: FedFRConfig, num_public: int) -> tuple[FedFRModel, int]:
    """The global model of a checkpoint and the round it ended."""
    ckpt = torch_load(path)
    model = fedfr_model(f, num_public, 0)
    state = dict(ckpt["state_dict_shared"])
    model.load_state_dict(state, strict=False)
    missing = set(expected_fedfr_manifest(f, num_public).keys) - set(state)
    if missing:
        raise ValueError(f"{path} lacks {sorted(missing)[:3]}...: not a FedFR global model of this config")
    return model, int(ckpt["round"])


def fedfr_eval_main(cfg: ExperimentConfig) -> int:
    """Score the generic and personalised FedFR models of ``cfg.run_dir``; 0 on success, 1 if nothing to score."""
    f, run_dir = cfg.fedfr, cfg.resolved_run_dir()
    device = torch.device(cfg.eval.device)
    if cfg.train.threads > 0:
        torch.set_num_threads(cfg.train.threads)
    generic: dict[str, nn.Module] = {}
    num_public = 0
    if pretrained_path(cfg).is_file():
        m0, _ = load_pretrained(pretrained_path(cfg), f)
        num_public = m0.num_public
        generic["pretrained Theta_g^0"] = m0.backbone
    final = next((p for p in (run_dir / "global_final.pt", run_dir / "global_latest.pt") if p.is_file()), None)
    final_round = None
    if final is not None and num_public:
        model, final_round = load_global(final, f, num_public)
        generic["FedFR Theta_g"] = model.backbone
    if not generic:
        print(f"fedeval: no FedFR model in {run_dir} (pretrained.pt / global_final.pt)", file=sys.stderr)
        return 1
    results: dict = {"run_dir": str(run_dir), "generic": {}, "personalised": {}, "personalised_per_site": {}}
    if f.ijbc_root:
        meta = read_ijbc_meta(f.ijbc_root)
        results["generic_protocol"] = generic_protocol(meta, f)
        for name, bb in generic.items():
            results["generic"][name] = generic_metrics(bb, meta, cfg, device)
    report = sites_report(run_dir, list(cfg.sites), final_round) if final_round is not None else None
    reported = report["personalised"] if report else {}
    for name in [*generic, *reported]:
        if name in reported:
            results["personalised"][name] = reported[name]
            results["personalised_per_site"][name] = report["personalised_per_site"][name]
            continue
        try:
            sites = eval_sites(cfg)
        except (OSError, ValueError) as e:
            print(f"fedeval: {name} not scored on the personalised protocol here: {e}", flush=True)
            continue
        mean, per_site = personalised_metrics(generic[name], sites, cfg, device)
        results["personalised"][name] = mean
        results["personalised_per_site"][name] = per_site
    write_reports(results, run_dir, f)
    return 0


def _table(rows: dict[str, dict[str, float]], cols: list[str]) -> tuple[str, str]:
    """(markdown, csv) of percentages."""
    md = ["| model | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["model", *cols])
    for name, m in rows.items():
        md.append(f"| {name} | " + " | ".join(f"{100 * m[c]:.2f}" if c in m else "-" for c in cols) + " |")
        w.writerow([name, *[f"{100 * m[c]:.4f}" if c in m else "" for c in cols]])
    return "\n".join(md), buf.getvalue()


def write_reports(results: dict, run_dir: Path, f: FedFRConfig) -> None:
    tar = [f"TAR@FAR={a:g}" for a in f.far_targets]
    tpir = [f"TPIR@FPIR={a:g}" for a in f.fpir_targets]
    rank = [f"rank-{k}" for k in f.ranks]
    text = [f"# FedFR evaluation ({run_dir})", ""]
    if results["generic"]:
        rows = {n: generic_headline(m) for n, m in results["generic"].items()}
        md, c = _table(rows, tar + tpir + rank)
        atomic_write_bytes(run_dir / "fedfr_eval_generic.csv", c.encode())
        one_n = {"nist": "mean of G1, G2 (NIST open set)", "insightface": "G1+G2, insightface's ijb_1n"}
        p = results.get("generic_protocol", {})
        how = (
            f"1:N {one_n.get(p.get('identification', 'nist'))}; detector-score weighting "
            f"{'on' if p.get('detector_score') else 'off'}; flip {'on' if p.get('flip') else 'off'}; "
            f"alignment: {p.get('alignment', '?')}"
        )
        text += ["## Generic model, IJB-C-style 1:1 (TAR@FAR) and 1:N, %", "", how, "", md, ""]
    personal_tpir = [f"TPIR@FPIR={a:g}" for a in f.personal_fpir_targets]
    md, c = _table(results["personalised"], tar + personal_tpir + rank)
    atomic_write_bytes(run_dir / "fedfr_eval_personalised.csv", c.encode())
    n_sites = len(next(iter(results["personalised_per_site"].values()), {}))
    text += [f"## Personalised protocol, mean over {n_sites} sites, %", "", md, ""]
    report = "\n".join(text)
    atomic_write_bytes(run_dir / "fedfr_eval.md", report.encode())
    atomic_json_save(results, run_dir / "fedfr_eval.json")
    print(report, flush=True)
    print(f"fedeval: wrote fedfr_eval.json, fedfr_eval.md and the CSV tables to {run_dir}", flush=True)


def run_config(args: list[str]) -> ExperimentConfig:
    """The run's own ``<run_dir>/config.json`` (written by fedserver) when there is one, else conf/.

    KEY=VALUE arguments override either (``experiment=`` only picks the conf/ experiment).
    """
    from common.config.compose import compose_experiment, merge_overrides

    run_dir = next((a.split("=", 1)[1] for a in args if a.startswith("run_dir=")), None)
    saved = Path(run_dir).expanduser() / "config.json" if run_dir else None
    if saved is None or not saved.is_file():
        has_experiment = any(a.startswith("experiment=") for a in args)
        return compose_experiment(args if has_experiment else ["experiment=fedfr", *args])
    rest = [a for a in args if not a.startswith(("run_dir=", "experiment="))]
    cfg = merge_overrides(rest, saved=json.loads(saved.read_text()))
    cfg.run_dir = str(saved.parent.resolve())
    return cfg


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        cfg = run_config(args)
    except Exception as e:  # noqa: BLE001 - hydra and validation errors: one clear line
        raise SystemExit(f"fedeval: bad configuration: {e}") from None
    try:
        code = fedfr_eval_main(cfg)
    except UnsafeCheckpointError as e:  # a crafted or older pretrained.pt / global_final.pt / site state
        raise SystemExit(f"fedeval: {e}") from None
    sys.exit(code)


if __name__ == "__main__":
    main()
