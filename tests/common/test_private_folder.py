"""A site's state folder must be its user's alone (common/private_folder.py), and fedclient says so
in one line before anything starts."""

from __future__ import annotations

import os

import pytest

from client.deploy.fedclient import main as fedclient_main
from common.private_folder import NotPrivateError, check_private, make_private


@pytest.mark.parametrize("mode", [0o700, 0o750, 0o755, 0o711])
def test_an_own_folder_nobody_else_can_write_passes(tmp_path, mode):
    folder = tmp_path / "state"
    folder.mkdir()
    folder.chmod(mode)
    assert check_private(folder, "state folder") == folder


@pytest.mark.parametrize("mode", [0o770, 0o775, 0o757, 0o777, 0o1777, 0o720, 0o702])
def test_a_folder_group_or_others_can_write_is_refused(tmp_path, mode):
    folder = tmp_path / "state"
    folder.mkdir()
    folder.chmod(mode)
    with pytest.raises(
        NotPrivateError, match=f"writable by group or others \\(mode {mode & 0o7777:04o}\\).*chmod go-w"
    ):
        check_private(folder, "state folder")


def test_a_folder_of_another_user_is_refused(tmp_path):
    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    me = os.geteuid()
    with pytest.raises(NotPrivateError, match=f"owned by uid {me}, not by this user \\(uid {me + 1}\\)"):
        check_private(folder, "state folder", uid=me + 1)
    if me == 0:  # a real other owner
        os.chown(folder, 65534, 65534)
        with pytest.raises(NotPrivateError, match="owned by uid 65534, not by this user \\(uid 0\\)"):
            check_private(folder, "state folder")


def test_make_private_creates_the_folder_0700_whatever_the_umask(tmp_path):
    old = os.umask(0o002)
    try:
        folder = make_private(tmp_path / "a" / "state")
    finally:
        os.umask(old)
    assert folder.stat().st_mode & 0o777 == 0o700
    check_private(folder, "state folder")


def test_fedclient_refuses_a_state_folder_others_can_write_in_one_line(tmp_path, tiny_site):
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o777)
    argv = ["--site", "market1501", "--data-root", str(tiny_site), "--reader", "market1501"]
    argv += ["--state-dir", str(state), "--insecure", "--batch-size", "4"]
    with pytest.raises(SystemExit) as e:
        fedclient_main(argv)
    msg = str(e.value.code)
    assert msg.startswith(
        f"fedclient: site market1501: state folder (--state-dir) {state} is writable by group or others"
    )
    assert "\n" not in msg
    assert not (state / "site.sock").exists()  # nothing was started
