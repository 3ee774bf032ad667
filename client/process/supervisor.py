"""``fedclient``'s keeper of the site process: starts it, restarts it from its state file when it
dies (bounded), stops it with ``fedclient``.

A site process that dies mid-round makes that round's reply an error (the ClientApp forwarder
finds the channel closed); the restarted process reads the site's state file on its first
message, so the site rejoins the next round from its last finished one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from common import processes


def site_process_cmd(socket: str | Path, node_config: dict) -> list[str]:
    return [
        sys.executable,
        "-m",
        "client.process.site_process",
        "--socket",
        str(socket),
        "--node-config-json",
        json.dumps(node_config),
    ]


class SiteSupervisor:
    def __init__(
        self,
        site: str,
        cmd: list[str],
        env: dict[str, str],
        *,
        max_restarts: int = 5,
        log=None,
        what: str = "site process",
        restart: str = "restarting it from its state file",
    ) -> None:
        if max_restarts < 0:
            raise ValueError(f"--site-restarts must be >= 0, found {max_restarts}")
        self.site = site
        self.what = what  # how the log names the process (the site process, the SuperExec)
        self.restart_note = restart
        self.cmd = cmd
        self.env = env
        self.max_restarts = max_restarts
        self.restarts = 0
        self.proc: subprocess.Popen | None = None
        self._log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))

    def start(self) -> subprocess.Popen:
        self.proc = processes.start(self.cmd, self.env)
        return self.proc

    def check(self) -> bool:
        """Restart the site process if it died; False once the restarts are used up (it stays down)."""
        if self.proc is None or self.proc.poll() is None:
            return True
        code = self.proc.returncode
        how = f"signal {-code}" if code < 0 else f"exit code {code}"
        processes.stop(self.proc, grace_s=2)  # anything it left in its group
        if self.restarts >= self.max_restarts:
            self._log(
                f"fedclient: site {self.site}: the {self.what} ended ({how}) and was restarted "
                f"{self.restarts} times already (--site-restarts {self.max_restarts}): giving up"
            )
            self.proc = None
            return False
        self.restarts += 1
        self._log(
            f"fedclient: site {self.site}: the {self.what} ended ({how}); {self.restart_note} "
            f"(restart {self.restarts} of {self.max_restarts}); the site rejoins the next round"
        )
        time.sleep(min(5.0, 0.5 * self.restarts))  # a crash loop does not spin
        self.start()
        return True

    def stop(self, grace_s: float = 10.0) -> None:
        if self.proc is not None:
            processes.stop(self.proc, grace_s=grace_s)
