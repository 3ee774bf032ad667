"""``make compose-demo``'s two steps that run inside a container of the image (docker/compose-demo.sh).

    python -m server.demos.compose_demo setup DEMO_DIR [fedreid|fedfr] [full|quick]   # secrets, site keys, registry, data
    python -m server.demos.compose_demo result RUN_DIR                   # the one result line of the finished run

``setup`` does what docker/README.md's operator and sites do before a first start, with the
project's own code: ``fedserver certs`` (the server certificate names ``superlink``, the compose
service), each site's key pair as ``fedclient keygen`` writes it (``common.security``; the
coordinator's code imports no site code) and ``fedserver register-site``, then the demo's synthetic
data: for FedReID (server/demos/fedreid_demo.py) each site in the layout of the dataset it stands for and
the two unseen target domains the coordinator evaluates on; for FedFR the face world and its
pre-trained generic model (server/demos/fedfr_compose_demo.py), pre-trained as the scale's experiment says
(``quick``: ``compose-fedfr-demo-quick`` on a smaller face world, the machinery check of
tests/e2e/test_docker_compose.py). Everything is handed to the image's user
(the compose services run as it), keys readable by it alone.

``result`` reads ``metrics.json``: for FedReID the global model's mean R1 / mAP on the unseen domains
after the last round (and before the first) and each site's training loss of the last round; for
FedFR the sites' personalised evaluation; on one line.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

from common.security import write_site_keys
from server.demos import fedfr_compose_demo as fedfr_demo
from server.demos.fedreid_demo import DEFAULT_SITES, target_domains, write_data
from server.deploy.admin import certs_main, register_site_main

IMAGE_UID = 10001  # the image's user (docker/Dockerfile), the compose services' default user
# the demo's world, as `make demo` writes it (server/demos/fedsim.py's defaults), sites in their real layouts
TRAIN_IDS, IMAGES_PER_ID, TARGET_IDS = 40, 8, 30


TASKS = ("fedreid", "fedfr")
# FEDREID_DEMO_SCALE (docker/compose-demo.sh): the demo itself, or its machinery at its smallest
SCALES = {"full": "", "quick": "-quick"}  # the suffix of the compose experiment's name


def setup(demo_dir: Path, task: str = "fedreid", scale: str = "full", uid: int = IMAGE_UID) -> None:
    """secrets/{tls,sites,registry} and the task's data under ``demo_dir``, owned by ``uid``."""
    secrets, data = demo_dir / "secrets", demo_dir / "data"
    if certs_main([str(secrets / "tls"), "--host", "superlink"]) != 0:
        raise RuntimeError("fedserver certs failed")
    sites = fedfr_demo.SITES if task == "fedfr" else DEFAULT_SITES
    for site in sites:
        if not (secrets / "sites" / f"{site}.key").exists():  # a rerun keeps the keys it made
            write_site_keys(secrets / "sites", site)  # what `fedclient keygen` writes
        register_site_main(
            [str(secrets / "sites" / f"{site}.pub"), "--site", site, "--keys-dir", str(secrets / "registry")]
        )
    if task == "fedfr":
        quick = scale == "quick"
        fedfr_demo.write_world(
            demo_dir, fedfr_demo.EXPERIMENT + SCALES[scale], fedfr_demo.QUICK_WORLD if quick else None
        )
    else:
        write_data(
            data,
            DEFAULT_SITES,
            train_ids=TRAIN_IDS,
            images_per_id=IMAGES_PER_ID,
            target_ids=TARGET_IDS,
            real_layouts=True,
            targets=len(target_domains()),
        )
    # bind mounts keep their ownership: the services' user reads them, and nobody else reads a key
    for path in [demo_dir, *demo_dir.rglob("*")]:
        if os.geteuid() == 0:
            os.chown(path, uid, uid, follow_symlinks=False)
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else (0o600 if path.suffix == ".key" else 0o644))


def result_line(rows: list[dict]) -> str:
    """The run's one line: FedFR's when the sites evaluated (:func:`server.demos.fedfr_compose_demo.result_line`), else
    ``compose-demo: round N: mean R1 ...% mAP ...% on <targets> (untrained ...); sites' loss ...``."""
    if any("site_eval" in r for r in rows):
        return fedfr_demo.result_line(rows)
    evaluated = [r for r in rows if "mean/R1" in r]
    trained = [r for r in rows if r.get("round", 0) > 0]
    if not evaluated or not trained:
        raise ValueError(
            f"metrics.json: expected evaluated and trained rounds, found rounds {[r.get('round') for r in rows]}"
        )
    first, last = evaluated[0], evaluated[-1]
    targets = sorted(
        k[: -len("/R1")] for k in last if k.endswith("/R1") and not k.startswith(("mean/", "site/", "best/"))
    )
    sites = trained[-1].get("sites", {})
    losses = ", ".join(
        f"{s} {m['loss']:.2f}" for s, m in sorted(sites.items()) if math.isfinite(m.get("loss", math.nan))
    )
    return (
        f"compose-demo: round {last['round']}: mean R1 {100 * last['mean/R1']:.1f}% mAP {100 * last['mean/mAP']:.1f}% "
        f"on {', '.join(targets)} (round {first['round']}: R1 {100 * first['mean/R1']:.1f}% mAP "
        f"{100 * first['mean/mAP']:.1f}%); {len(sites)} sites trained round {trained[-1]['round']}, loss: {losses}"
    )


def main(argv: list[str]) -> None:
    setup_args = (
        argv[:1] == ["setup"]
        and 2 <= len(argv) <= 4
        and (len(argv) < 3 or argv[2] in TASKS)
        and (len(argv) < 4 or argv[3] in SCALES)
    )
    if not setup_args and not (argv[:1] == ["result"] and len(argv) == 2):
        raise SystemExit(
            f"usage: python -m server.demos.compose_demo setup DEMO_DIR [{'|'.join(TASKS)}] [{'|'.join(SCALES)}] "
            f"| result RUN_DIR; found {argv}"
        )
    if argv[0] == "setup":
        setup(Path(argv[1]), *argv[2:])
        return
    path = Path(argv[1]) / "metrics.json"
    try:
        rows = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"expected the run's metrics in {path}, found none ({e})") from None
    print(result_line(rows), flush=True)


if __name__ == "__main__":
    from common.console import console_script

    console_script("compose-demo", main, sys.argv[1:])
