"""FedFR's data setting from an identity-folder face set (Liu et al., AAAI 2022, "Datasets"), seeded.

    SRC/<identity>/<images>  ->  OUT/public/<identity>/...                    K_g public identities
                                 OUT/clients/<site>/train/<identity>/...      n_train per identity
                                 OUT/clients/<site>/test/<identity>/...       n_test per identity
                                 OUT/split.json                               parameters and counts

The paper: 10k MS-Celeb-1M identities x 100 images; K_g = 6000 public; the other 4000 equally
over C clients (40 x 100 in the ablation); per client identity 60 train / 40 test images. Every
count here is a parameter. Identities are drawn by a seeded permutation: the public ones first,
then each client's (only identities with at least n_train + n_test images can go to a client;
with ``ids_per_client`` 0 the eligible rest is spread equally). Each client identity's images are
shuffled (seeded) and cut into train/test; a public identity keeps all its images (or
``public_images`` of them). Files are hard-linked (copied across file systems), or copied.

    python -m common.datasets.face_split SRC OUT --public 6000 --clients 40 --ids-per-client 100 \\
        --train 60 --test 40 --seed 0 [--site-prefix face] [--site-conf conf/site]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from common.config.site import default_state_dir
from common.datasets.face_folder import FaceFolder
from common.seeding import stable_seed


@dataclass
class SplitPlan:
    """Which source image goes where; ``sites`` maps a site name to {identity: (train, test)}."""

    public: dict[str, list[str]] = field(default_factory=dict)
    sites: dict[str, dict[str, tuple[list[str], list[str]]]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # identities left out (too few images / not needed)

    def counts(self) -> dict:
        return {
            "public_identities": len(self.public),
            "public_images": sum(len(v) for v in self.public.values()),
            "sites": {
                s: {
                    "identities": len(ids),
                    "train_images": sum(len(t) for t, _ in ids.values()),
                    "test_images": sum(len(t) for _, t in ids.values()),
                }
                for s, ids in self.sites.items()
            },
            "skipped_identities": len(self.skipped),
        }


def plan_split(
    identities: dict[str, list[str]],
    *,
    num_public: int,
    num_clients: int,
    ids_per_client: int = 0,
    train_per_id: int = 60,
    test_per_id: int = 40,
    public_images: int = 0,
    seed: int = 0,
    site_prefix: str = "face",
) -> SplitPlan:
    """The split of ``identities`` (name -> image paths); raises when the counts cannot be met."""
    if num_public < 0 or num_clients < 1 or train_per_id < 1 or test_per_id < 1:
        raise ValueError("num_clients, train_per_id and test_per_id must be >= 1 and num_public >= 0")
    names = sorted(identities)
    order = [names[i] for i in np.random.default_rng(stable_seed("face-split", seed)).permutation(len(names))]
    if len(order) <= num_public:
        raise ValueError(f"{len(order)} identities cannot give {num_public} public ones and any client")
    public, rest = order[:num_public], order[num_public:]
    need = train_per_id + test_per_id
    pool = [n for n in rest if len(identities[n]) >= need]
    k = ids_per_client or len(pool) // num_clients
    if k < 1 or k * num_clients > len(pool):
        raise ValueError(
            f"{num_clients} clients x {ids_per_client or 'an equal share of'} identities need "
            f"{max(k, 1) * num_clients} identities with >= {need} images ({train_per_id} train + {test_per_id} test) "
            f"outside the {num_public} public ones; found {len(pool)}"
        )
    plan = SplitPlan()
    for n in public:
        imgs = sorted(identities[n])
        if public_images:
            imgs = sorted(_shuffled(imgs, seed, n)[:public_images])
        plan.public[n] = imgs
    for c in range(num_clients):
        site = f"{site_prefix}{c + 1}"
        plan.sites[site] = {}
        for n in pool[c * k : (c + 1) * k]:
            imgs = _shuffled(sorted(identities[n]), seed, n)
            plan.sites[site][n] = (sorted(imgs[:train_per_id]), sorted(imgs[train_per_id:need]))
    used = set(plan.public) | {n for ids in plan.sites.values() for n in ids}
    plan.skipped = [n for n in names if n not in used]
    return plan


def _shuffled(items: list[str], seed: int, name: str) -> list[str]:
    perm = np.random.default_rng(stable_seed("face-split-images", seed, name)).permutation(len(items))
    return [items[i] for i in perm]


def write_split(plan: SplitPlan, out: str | Path, *, copy: bool = False) -> Path:
    """Materialise ``plan`` under ``out`` (see the module docstring); returns ``out/split.json``."""
    out = Path(out)
    for n, imgs in plan.public.items():
        _place(imgs, out / "public" / n, copy)
    for site, ids in plan.sites.items():
        for n, (train, test) in ids.items():
            _place(train, out / "clients" / site / "train" / n, copy)
            _place(test, out / "clients" / site / "test" / n, copy)
    path = out / "split.json"
    path.write_text(json.dumps({"counts": plan.counts(), "plan": asdict(plan)}, indent=1))
    return path


def _place(images: list[str], folder: Path, copy: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for src in images:
        dst = folder / Path(src).name
        if dst.exists():
            continue
        if copy:
            shutil.copy2(src, dst)
            continue
        try:
            os.link(src, dst)
        except OSError:  # another file system, or links not allowed
            shutil.copy2(src, dst)


def write_site_configs(plan: SplitPlan, out: str | Path, conf_site_dir: str | Path) -> list[Path]:
    """One ``conf/site/<site>.yaml`` per client (reader face_site, data_root under ``out``)."""
    conf_site_dir = Path(conf_site_dir)
    conf_site_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for site in plan.sites:
        p = conf_site_dir / f"{site}.yaml"
        root = (Path(out) / "clients" / site).resolve()
        p.write_text(
            f"# FedFR site {site} (written by common.datasets.face_split)\nname: {site}\n"
            f"reader: face_site\ndata_root: {root}\nstate_dir: {default_state_dir(site)}\n"
        )
        paths.append(p)
    return paths


def read_identities(src: str | Path) -> dict[str, list[str]]:
    reader = FaceFolder(src)
    out: dict[str, list[str]] = {n: [] for n in reader.names}
    for r in reader.records:
        out[reader.names[r.pid]].append(r.path)
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m common.datasets.face_split",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("src", help="identity-folder dataset (one sub-folder per identity)")
    p.add_argument("out", help="output folder (public/, clients/<site>/{train,test}/, split.json)")
    p.add_argument(
        "--public",
        type=int,
        required=True,
        help="K_g: public identities (paper: 6000; 0 = clients only, public data from elsewhere)",
    )
    p.add_argument("--clients", type=int, required=True, help="C: client sites (paper ablation: 40)")
    p.add_argument("--ids-per-client", type=int, default=0, help="identities per client (0: spread the rest equally)")
    p.add_argument("--train", type=int, default=60, help="train images per client identity (default %(default)s)")
    p.add_argument("--test", type=int, default=40, help="test images per client identity (default %(default)s)")
    p.add_argument("--public-images", type=int, default=0, help="images per public identity (0: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--site-prefix", default="face", help="site names <prefix>1..<prefix>C (default %(default)s)")
    p.add_argument("--site-conf", help="also write <DIR>/<site>.yaml for each client (e.g. conf/site)")
    p.add_argument("--copy", action="store_true", help="copy files instead of hard-linking them")
    return p


def main(argv: list[str] | None = None) -> None:
    p = parser()
    a = p.parse_args(argv)
    plan = plan_split(
        read_identities(a.src),
        num_public=a.public,
        num_clients=a.clients,
        ids_per_client=a.ids_per_client,
        train_per_id=a.train,
        test_per_id=a.test,
        public_images=a.public_images,
        seed=a.seed,
        site_prefix=a.site_prefix,
    )
    path = write_split(plan, a.out, copy=a.copy)
    if a.site_conf:
        write_site_configs(plan, a.out, a.site_conf)
    c = plan.counts()
    print(
        f"face_split: {c['public_identities']} public identities ({c['public_images']} images), "
        f"{len(c['sites'])} clients x {a.ids_per_client or 'equal share'} identities, "
        f"{c['skipped_identities']} identities unused; {path}"
    )


if __name__ == "__main__":
    main()
