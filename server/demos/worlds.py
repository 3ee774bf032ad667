"""The data of a ``fedsim`` run: a synthetic Re-ID world or a real classification set as a federated world.

- ``reid`` (default): one synthetic private dataset per site, each its own domain with its own
  identities, and two unseen synthetic target domains (server/demos/fedreid_demo.py ``write_data``).
- ``fashion-mnist`` / ``cifar10``: the FedReID paper's classification analysis on real images
  (common/datasets/class_world.py): sites with disjoint class subsets (``iid``: every site all
  training classes, disjoint images), some classes (the last two, or those named) held out as the
  unseen target.
- ``pool``: the centralised bound: one site, ``pooled``, holding every site's training images with
  their identities kept apart (the same world, pooled).

Everything is written once per data folder and reused (studies share one world across runs).
"""

from __future__ import annotations

from pathlib import Path


def read_fashion_mnist(root: str | Path) -> dict:
    """common/datasets/idx.py's reader, imported when a world is written (fedsim's help loads no numpy)."""
    from common.datasets.idx import read_fashion_mnist as read

    return read(root)


def read_cifar10(root: str | Path) -> dict:
    """common/datasets/cifar.py's reader, imported when a world is written."""
    from common.datasets.cifar import read_cifar10 as read

    return read(root)


CLASS_WORLDS = {"fashion-mnist": read_fashion_mnist, "cifar10": read_cifar10}
WORLDS = ("reid", *CLASS_WORLDS)
POOLED = "pooled"


def write_class_data(
    data_dir: Path,
    world: str,
    root: str | Path,
    sites: list[str],
    *,
    iid: bool = False,
    held_out: int | list[int] = 2,
    per_class: int = 300,
    queries_per_class: int = 100,
    gallery_per_class: int = 500,
    seed: int = 0,
    seen_target: bool = False,
) -> tuple[dict, dict]:
    """A classification set as sites + one held-out target (and, with ``seen_target``, a ``seen``
    target of the training classes' test images); returns (site -> (reader, root), target -> ...)."""
    from common.datasets.class_world import split_classes, write_class_world

    if world not in CLASS_WORLDS:
        raise SystemExit(f"--world: expected one of {sorted(CLASS_WORLDS)}, found {world!r}")
    try:
        data = CLASS_WORLDS[world](root)
    except (OSError, ValueError) as e:
        raise SystemExit(f"--world {world}: cannot read {root}: {e}") from None
    num_classes = int(max(data["train"][1].max(), data["test"][1].max())) + 1
    split = split_classes(num_classes, len(sites), held_out, iid=iid)
    if iid:
        per_class = max(1, per_class // len(sites))  # the same images in all, dealt out (disjoint) to the sites
    roots = write_class_world(
        data_dir / f"{world}{'-iid' if iid else ''}",
        split,
        data["train"],
        data["test"],
        site_names=sites,
        per_class=per_class,
        queries_per_class=queries_per_class,
        gallery_per_class=gallery_per_class,
        seed=seed,
        seen_target="seen" if seen_target else "",
    )
    targets = ["held_out", *(["seen"] if seen_target else [])]
    return ({s: ("market1501", roots[s]) for s in sites}, {t: ("market1501", roots[t]) for t in targets})


def pool_sites(data_dir: Path, roots: dict[str, tuple[str, Path]]) -> dict[str, tuple[str, Path]]:
    """{pooled: (market1501, folder)}: every site's training images in one site (Market-1501 layout)."""
    from common.datasets.class_world import pool_market_sites

    readers = {r for r, _ in roots.values()}
    if readers != {"market1501"}:
        raise SystemExit(f"--pool-sites needs every site in the Market-1501 layout, found readers {sorted(readers)}")
    key = "-".join(sorted(roots))
    out = data_dir / f"{POOLED}-{key}" if len(key) < 100 else data_dir / f"{POOLED}-{len(roots)}"
    done = out / ".complete"
    if not done.exists():
        pool_market_sites([Path(root) for _, root in roots.values()], out)
        done.touch()
    return {POOLED: ("market1501", out)}
