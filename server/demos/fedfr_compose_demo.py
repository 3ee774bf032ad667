"""``make compose-demo TASK=fedfr``'s FedFR parts (docker/compose.fedfr-demo.yaml): its world and its result line.

``write_world`` writes what ``python -m server.demos.fedfr_demo`` writes with its default sizes (a public
set, four face sites' splits, an IJB-C-style set) and pre-trains the generic model [Theta_g^0,
Phi_g] on the public identities (``fedserver fedfr.stage=pretrain``), so that the coordinator's
container only runs the federated rounds. ``result_line`` reads the run's ``metrics.json``: the
generic model on the IJB-C-style set, and the personalised protocol the sites ran on their own test
identities in the evaluate round (``personal/<row>/<metric>``: the mean over the sites).
"""

from __future__ import annotations

import math
from pathlib import Path

from common.config.compose import compose_experiment
from server.demos.fedfr_demo import parse_args, write_data
from server.fedfr.pretrain import pretrain_main

SITES = ["face1", "face2", "face3", "face4"]
EXPERIMENT = "compose-fedfr-demo"
# FEDREID_DEMO_SCALE=quick: a smaller face world (python -m server.demos.fedfr_demo's options), rendered
# in seconds instead of a minute; the machinery is the same
QUICK_WORLD = ["--public-ids", "40", "--public-images", "10", "--ids-per-site", "8"]
QUICK_WORLD += ["--train", "20", "--test", "10", "--ijbc-subjects", "12"]


def write_world(demo_dir: Path, experiment: str = EXPERIMENT, world: list[str] | None = None) -> None:
    """``demo_dir/data/{public,ijbc,split}`` and ``demo_dir/pretrained/pretrained.pt``, pre-trained as
    ``experiment`` (the compose run's own) says; ``world``: the demo's world options (default: its own)."""
    a, _ = parse_args(["--out", str(demo_dir), *(world or [])])
    roots = write_data(demo_dir / "data", SITES, a)
    cfg = compose_experiment(
        [
            f"experiment={experiment}",
            f"run_dir={demo_dir / 'pretrain'}",
            f"fedfr.public_root={roots['public']}",
            f"fedfr.pretrained={demo_dir / 'pretrained' / 'pretrained.pt'}",
            f"fedfr.image_size={a.size}",
        ]
    )
    if pretrain_main(cfg) != 0:
        raise RuntimeError("the FedFR demo's pre-training failed (above)")


def result_line(rows: list[dict]) -> str:
    """``compose-demo: round N: IJB-C ...; personalised at K sites: [Theta_l, Pi_l] ... vs Theta_g ...``."""
    personal = [r for r in rows if any(k.startswith("personal/personal/") for k in r)]
    if not personal:
        raise ValueError(
            "metrics.json: expected the sites' personalised evaluation (personal/personal/...), found it in no round"
        )
    last = personal[-1]
    metric = sorted(k.split("/", 2)[2] for k in last if k.startswith("personal/personal/"))[0]
    sites = last.get("site_eval", {})
    generic = next((f"{k} {100 * v:.1f}%" for k, v in sorted(last.items()) if k.startswith("ijbc/")), None)
    mine, theirs = last[f"personal/personal/{metric}"], last.get(f"personal/global/{metric}", math.nan)
    return (
        f"compose-demo: round {last['round']}: personalised evaluation at {len(sites)} sites: "
        f"{metric} {100 * mine:.1f}% with [Theta_l, Pi_l], {100 * theirs:.1f}% with Theta_g"
        + (f"; generic model on the IJB-C-style set: {generic}" if generic else "")
    )
