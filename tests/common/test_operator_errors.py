"""An operator's mistake gets one clear line at start: unwritable folders, corrupt images, too few
images for one batch. Nothing here starts a Flower process: every check runs before any would."""

from __future__ import annotations

from pathlib import Path

import pytest

from client.deploy import fedclient
from common.datasets.synthetic import write_market_layout
from common.writable import NotWritableError, check_writable
from server.deploy import fedserver

TRAIN_IDS, IMAGES_PER_ID = 4, 4  # 16 training images


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("market1501")
    write_market_layout(
        root, num_train_ids=TRAIN_IDS, num_test_ids=2, images_per_id=IMAGES_PER_ID, height=32, width=16, seed=3
    )
    return root


def a_file(tmp_path: Path) -> Path:
    """A regular file: a folder below it can be neither created nor written (also as root)."""
    f = tmp_path / "not_a_folder"
    f.write_text("x")
    return f


def one_line_exit(excinfo) -> str:
    msg = str(excinfo.value.code)
    assert "\n" not in msg and "Traceback" not in msg, msg
    return msg


def fedclient_args(data: Path, state: Path, *extra: str) -> list[str]:
    return [
        "--site",
        "market1501",
        "--insecure",
        "--data-root",
        str(data),
        "--reader",
        "market1501",
        "--state-dir",
        str(state),
        *extra,
    ]


def test_check_writable_creates_and_refuses(tmp_path):
    assert check_writable(tmp_path / "a" / "b", "run_dir") == (tmp_path / "a" / "b").resolve()
    assert list((tmp_path / "a" / "b").iterdir()) == []  # the probe file is gone
    bad = a_file(tmp_path) / "run"
    with pytest.raises(NotWritableError, match=r"run_dir .*not_a_folder/run is not writable \(Not a directory\)"):
        check_writable(bad, "run_dir")


def test_fedserver_refuses_an_unwritable_run_dir_in_one_line(tmp_path):
    bad = a_file(tmp_path) / "run"
    with pytest.raises(SystemExit) as e:
        fedserver.main(["experiment=demo", f"run_dir={bad}", "superlink.insecure=true"])
    msg = one_line_exit(e)
    assert msg.startswith("fedserver: run_dir ") and str(bad) in msg and "not writable" in msg


def test_fedclient_refuses_an_unwritable_state_folder_in_one_line(site, tmp_path):
    bad = a_file(tmp_path) / "state"
    with pytest.raises(SystemExit) as e:
        fedclient.main(fedclient_args(site, bad, "--batch-size", "4"))
    msg = one_line_exit(e)
    assert msg.startswith("fedclient: site market1501: state folder") and str(bad) in msg and "not writable" in msg


@pytest.mark.parametrize("given", [None, 32, 17])
def test_fedclient_with_fewer_images_than_one_batch_fails_at_start(site, tmp_path, given):
    extra = ["--batch-size", str(given)] if given else []
    with pytest.raises(SystemExit) as e:
        fedclient.main(fedclient_args(site, tmp_path / "state", *extra))
    msg = one_line_exit(e)
    batch = given or 32  # the config's default train.batch_size
    assert f"{TRAIN_IDS * IMAGES_PER_ID} training images is fewer than one batch ({batch}" in msg
    assert not (tmp_path / "state").exists()  # refused before anything was written


def test_verify_images_passes_a_clean_site(site, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        fedclient.main(fedclient_args(site, tmp_path / "state", "--verify-images"))
    assert e.value.code == 0
    # every image the site uses: train, query and the gallery (junk "-1" files are not read)
    base = next(site.iterdir())
    used = [
        p
        for d in ("bounding_box_train", "query", "bounding_box_test")
        for p in (base / d).glob("*.jpg")
        if not p.name.startswith("-1")
    ]
    assert f"all {len(used)} images decode" in capsys.readouterr().out


def test_verify_images_lists_every_corrupt_file(tmp_path, capsys):
    root = tmp_path / "site"
    write_market_layout(
        root, num_train_ids=TRAIN_IDS, num_test_ids=2, images_per_id=IMAGES_PER_ID, height=32, width=16, seed=4
    )
    base = next(root.iterdir())
    truncated = sorted((base / "bounding_box_train").glob("*.jpg"))[2]
    garbage = min((base / "query").glob("*.jpg"))
    truncated.write_bytes(truncated.read_bytes()[:120])
    garbage.write_bytes(b"this is not an image")
    with pytest.raises(SystemExit) as e:
        fedclient.main(fedclient_args(root, tmp_path / "state", "--verify-images"))
    assert e.value.code == 1
    err = capsys.readouterr().err
    listed = [ln.strip().split(": ", 1)[0] for ln in err.splitlines()[1:]]
    assert sorted(listed) == sorted([str(truncated), str(garbage)])
    assert err.splitlines()[0].startswith("fedclient: site market1501: 2 of ")
