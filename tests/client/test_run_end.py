"""fedclient's exit status (client.process.run_end): only a run that reached its last round is a success;
refused sites with real processes are in tests/e2e/test_registered_sites_e2e.py."""

from __future__ import annotations

from client.process.run_end import Progress, exit_status

HINT = "register the key with `fedserver register-site"


def test_exit_status_only_the_last_round_is_a_success():
    t0 = 1000.0
    ok = exit_status("a", 0, Progress(5, 5, t0 + 1), t0, superlink="h:1", auth_key=None)
    assert ok[0] == 0 and "round 5 of 5" in ok[1]
    for code, progress in [
        (0, None),
        (0, Progress(3, 5, t0 + 1)),
        (0, Progress(5, 5, t0 - 1)),  # an older run's
        (305, Progress(5, 5, t0 + 1)),
        (1, None),
    ]:
        status, msg = exit_status("a", code, progress, t0, superlink="h:1", auth_key="k/a.key")
        assert status == 1 and HINT in msg and f"exit code {code}" in msg and "\n" not in msg
