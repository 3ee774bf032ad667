"""``fedserver``: the coordinator's command line. Starts the Flower SuperLink, submits the run, waits for it.

fedserver [HYDRA_OVERRIDES...]       e.g. fedserver rounds=100 strategy.fraction=0.5 privacy.beta=0.001
fedserver --help                     this text and every configuration key with its default
fedserver --cfg                      print the composed configuration and exit
fedserver resume=RUN_DIR             continue a stopped run after its last complete round

The help, the composed configuration and every configuration mistake need only the configuration;
the run itself is ``server/deploy/coordinator.py``, imported when a run starts.
"""

from __future__ import annotations

import json
import sys
import textwrap

from common.config.compose import compose_experiment, experiment_groups
from common.config.experiment import ExperimentConfig
from common.config.structured import ConfigError
from common.writable import NotWritableError, check_writable
from server.deploy import admin
from server.deploy.superlink_settings import check_superlink_settings

USAGE = """usage: fedserver [KEY=VALUE ...] [GROUP=OPTION ...]

Coordinator of a FedReID or FedFR federation. Starts a Flower SuperLink on `superlink.address`
(one HTTP(S) port: sites connect there, and `flwr run` submits the run there), waits for
`strategy.min_available_sites` sites (`fedclient --site NAME`), runs `rounds` rounds and leaves
metrics.json / metrics.csv / curves.png / global_final.pt in `run_dir` (an earlier run's outputs
there are moved to `run_dir/previous/`). Exits 0 when the run completed, 1 otherwise; stops every
process it started.

Groups:  {groups}
FedFR:   fedserver experiment=fedfr fedfr.stage=pretrain fedfr.public_root=DIR   (Theta_g^0, Phi_g)
         fedserver experiment=fedfr fedfr.public_root=DIR sites=[face1,...]      (the federated run)
         every fedfr.* key is documented in common/config/fedfr.py; sites: fedclient --site face1
Options: --help (this text), --debug (a traceback instead of the one-line error)
Config:  fedserver show-config [KEY=VALUE ...]  prints the composed configuration (also: --cfg job);
         every key with its default and meaning: docs/configuration.md
TLS:     superlink.ca_cert=ca.crt superlink.cert=server.pem superlink.key=server.key
         (plain text needs an explicit superlink.insecure=true and prints a warning)
Sites:   superlink.node_auth=true superlink.site_keys=DIR: only registered site keys may join
Public:  on a non-loopback superlink.address the SuperLink listens on 127.0.0.1:superlink.loopback_port
         and fedserver starts nginx (apt-get install nginx-light) in front of it, forwarding only the
         Fleet API; without nginx it refuses, unless superlink.behind_proxy=true (your own proxy)
Signing: every instruction is signed with superlink.coordinator_key (default: coordinator.key beside
         superlink.ca_cert; in plain text RUN_DIR/coordinator.key); sites verify it with coordinator.pub
Admin:   fedserver certs | register-site | list-sites | unregister-site  (each with --help)
Resume:  fedserver resume=RUN_DIR [superlink.*=... round_timeout_s=... wait_for_sites_s=...]
         continues a stopped or crashed run from RUN_DIR/global_latest.pt (written after every
         round) with RUN_DIR/config.json. app_dir, superlink.* and engine.ray_address are never read
         from that file: give them again (TLS files, node_auth, site_keys, address); saved values
         that differ are named in one line and not used. The SuperLink starts with a fresh state: a
         superlink.db or site_nodes.json in RUN_DIR is removed, never opened (with node_auth the site
         keys are registered again from superlink.site_keys). Then restart every site's fedclient:
         the new SuperLink does not know their nodes
"""


def usage() -> str:
    """USAGE with every config group and its options, read from conf/ (``experiment_groups``)."""
    words = [f"{g}={'|'.join(opts)}" for g, opts in experiment_groups().items()]
    # a group's word stays whole (on a line of its own when longer than the width): the names are copied
    groups = textwrap.fill(
        "   ".join(words), width=100, subsequent_indent=" " * 9, break_on_hyphens=False, break_long_words=False
    )
    return USAGE.format(groups=groups)


def split_command(args: list[str]) -> tuple[bool, list[str]]:
    """(print the config and exit?, the KEY=VALUE overrides) of fedserver's command line."""
    show = "--cfg" in args or "show-config" in args  # anywhere: `fedserver rounds=7 show-config` too
    if "--cfg" in args:  # Hydra's spelling: --cfg job (the only kind of config this command has)
        i = args.index("--cfg")
        args = args[:i] + args[i + 1 + (args[i + 1 : i + 2] == ["job"]) :]
    args = [a for a in args if a != "show-config"]
    bad = [a for a in args if a.startswith("-")]
    if bad:
        raise ConfigError(f"unknown option(s) {bad}; configuration is given as KEY=VALUE (see --help)")
    return show, args


def resumed_config(run_dir: str, overrides: list[str]) -> ExperimentConfig:
    """``resume=RUN_DIR``: the stopped run's configuration with the operational ``overrides``."""
    from common.checkpoint import UnsafeCheckpointError
    from server.deploy.resume import resume_config  # reads the run's checkpoint and task (torch, Flower)

    try:
        return resume_config(run_dir, overrides)
    except UnsafeCheckpointError as e:  # a crafted or older checkpoint
        raise SystemExit(f"fedserver: {e}") from None


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in admin.SUBCOMMANDS:  # certs, register-site, list-sites, unregister-site
        sys.exit(admin.SUBCOMMANDS[args[0]](args[1:]))
    if any(a in ("-h", "--help") for a in args):
        print(usage(), end="")
        return
    show, args = split_command(args)
    resume = [a for a in args if a.startswith("resume=")]
    try:
        if resume:  # fedserver resume=RUN_DIR [operational overrides]
            cfg = resumed_config(resume[0].partition("=")[2], [a for a in args if a not in resume])
        else:
            cfg = compose_experiment(args)
    except ValueError as e:  # hydra and validation errors: one clear line (common/cli_errors.py), exit 2
        raise ConfigError(f"bad configuration: {e}") from None
    if show:
        print(json.dumps(cfg.to_dict(), indent=2))
        return
    try:  # one line now, rather than a traceback (or an error after the first round)
        check_writable(cfg.run_dir, "run_dir")
    except NotWritableError as e:
        raise SystemExit(f"fedserver: {e}") from None
    if cfg.engine.name == "deployment" and cfg.fedfr.stage != "pretrain":  # a pre-training starts no SuperLink
        check_superlink_settings(cfg)  # TLS or an explicit insecure=true: one line now, not after the imports
    from server.deploy.coordinator import run  # the run's machinery (torch, Flower): only to run

    sys.exit(run(cfg, resume=bool(resume)))


if __name__ == "__main__":
    from common.console import console_script

    console_script("fedserver", main)
