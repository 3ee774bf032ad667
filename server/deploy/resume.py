"""Checkpoint and resume of a FedReID or FedFR run (``fedserver resume=RUN_DIR``), and the run
folder's turnover: a new run there first moves an earlier run's outputs to ``previous/``.

After every round the coordinator writes ``RUN_DIR/global_latest.pt`` in ONE atomic write
(temporary file, fsync, rename; ``common/checkpoint.py``): the global shared parameters by name,
the round k, the strategy state, the RNG states, the metrics history, the elapsed time, the config
and the manifest hash. A crash leaves the checkpoint of round k or of round k+1, never a mix.

``fedserver resume=RUN_DIR`` reads ``RUN_DIR/config.json`` (the experiment as it was started) and
the checkpoint, starts a new SuperLink and a new Flower run whose strategy starts from the
checkpointed parameters with ``round_offset=k`` and runs the remaining ``rounds - k`` rounds.
Only operational keys (addresses, timeouts, TLS files, evaluation device) may be changed on resume:
anything else would make the resumed run a different experiment.

A run folder is data, never instructions: whoever can write ``config.json`` (a folder handed over,
restored from a backup, shared) must not choose which code runs or how the coordinator's traffic is
protected. So the keys of ``COMMAND_LINE_ONLY`` (the Flower app folder, every ``superlink.*`` key:
addresses, TLS, node authentication, the key registry; the Ray cluster joined) are never read from
the saved file: they come from this command line and the defaults, as for a new run. Saved values
that differ are reported in one line, and not used.

Exactness: a run interrupted after round k and resumed ends with bit-identical global parameters
to an uninterrupted run when (1) ``strategy.fraction`` is 1 and client noise is off (``privacy.beta``
0 or ``privacy.client_noise=false``): sampling and the per-site noise draws are assigned in the order
of Flower node ids, which are new after a restart; (2) the sites train deterministically (CPU, same
``train.threads``); (3) each site still holds its state before round k+1 (``client/runtime/state.py`` keeps
the previous state file for that case). Server noise (Eq. 14) and DP noise are keyed by (the run's
noise secret, round): exact. The secret is not in the run folder: the checkpoint names the run id,
and the secret is read from the coordinator's own folder (``server/strategy/noise_secret.py``); a checkpoint
naming a run this coordinator did not start is refused.

How the sites rejoin. The SuperLink's state (registered nodes) is in memory by default: the
resumed SuperLink does not know the sites' node ids, answers their SuperNodes 401, and they exit
("SuperNode terminated gracefully"; fedclient then exits 1, client/process/run_end.py). Restart every site's
fedclient after a resume (by hand, or a service restart policy such as on-failure); each rejoins as a
new node and trains from its own state folder (tests/e2e/test_resume.py). A run folder's
SuperLink state (``superlink.db``, ``site_nodes.json``) is never reopened, even with
``superlink.persist_state=true``: a SuperLink executes the runs and trusts the node keys of its
database, so the resumed SuperLink starts fresh and the site keys are registered again from
``superlink.site_keys`` (server/deploy/coordinator.py ``discard_superlink_state``; docs/security.md). Messages of the dead run already pulled by a site may be trained once more (wasted work,
at most one round: the resumed run asks for that round again).
"""

from __future__ import annotations

import json
from pathlib import Path

from common.config.compose import REPO_ROOT, merge_overrides
from common.config.experiment import ExperimentConfig
from server.run.checkpoint import load_server_checkpoint
from server.run.folder import CHECKPOINT
from server.run.reporting import RoundReporter
from server.run.setup import last_round
from server.strategy.dp import dp_settings
from server.strategy.noise_secret import run_secret
from server.tasks import server_task

# keys that may be changed on resume: where and how the processes run, not what they compute
RESUMABLE_OVERRIDES = (
    "superlink.",
    "wait_for_sites_s",
    "round_timeout_s",
    "eval.device",
    "eval.batch_size",
    "app_dir",
    "engine.num_cpus",
    "engine.num_gpus",
    "engine.ray_address",
    "engine.ray_num_cpus",
    "engine.object_store_fraction",
    "coordinator_state_dir",
)


# keys that decide which code runs and how the coordinator's traffic is protected: on resume
# they come from the command line and the defaults, never from the run folder's config.json
# (and where the run's noise secret is read from: server/strategy/noise_secret.py)
COMMAND_LINE_ONLY = ("app_dir", "superlink", "engine.ray_address", "coordinator_state_dir")


def resume_config(run_dir: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """The experiment of ``run_dir/config.json`` set to continue from its checkpoint.

    ``resume_from`` is set when a checkpoint exists; without one (the coordinator died before
    round 0 was reported) the run simply starts again, which gives the same result. The keys of
    ``COMMAND_LINE_ONLY`` are this command's (``overrides``) or the defaults, whatever the file says.
    """
    run_dir = Path(run_dir).expanduser().resolve()
    path = run_dir / "config.json"
    if not path.is_file():
        raise ValueError(f"{path} not found: resume=RUN_DIR needs the folder of a run started by fedserver")
    for item in overrides or []:  # this command's policy, checked before the one merge
        key, sep, _ = item.partition("=")
        if not sep or not key.startswith(RESUMABLE_OVERRIDES):
            keys = ", ".join(k + "*" if k.endswith(".") else k for k in RESUMABLE_OVERRIDES)
            raise ValueError(
                f"on resume only these keys may be changed: {keys} "
                f"(found {item!r}); the experiment itself is read from {path}"
            )
    saved = json.loads(path.read_text())
    if not isinstance(saved, dict):
        raise ValueError(f"{path}: expected the run's configuration (a JSON object), found {type(saved).__name__}")
    saved["run_dir"] = str(run_dir)  # the folder given, also when it was moved since
    defaults = merge_overrides().to_dict()  # conf/ as for a new run, before this command's overrides
    trusted = dict(saved)
    for key in COMMAND_LINE_ONLY:
        _set(trusted, key, _get(defaults, key))
    cfg = merge_overrides(overrides, saved=trusted)
    if not cfg.app_dir:
        cfg.app_dir = str(REPO_ROOT)
    ignored = ignored_saved_keys(saved, cfg.to_dict())
    if ignored:  # one line, however many keys the file holds
        named = ", ".join(k[:60] for k in ignored[:16]) + (
            f" and {len(ignored) - 16} more" if len(ignored) > 16 else ""
        )
        print(
            f"fedserver: resume: {path} names {named} other than this command: not used "
            "(code and transport settings come from the command line and the defaults)",
            flush=True,
        )
    server_task(cfg.task).check_resumable(cfg)
    ck = run_dir / CHECKPOINT
    cfg.resume_from = str(ck) if ck.is_file() else ""
    if cfg.resume_from:  # refuse an unsafe or older file, or a run this coordinator did not start,
        # here, before any process starts
        run_secret(cfg.coordinator_state_dir, load_server_checkpoint(ck).strategy.get("run_id"))
    return cfg


_MISSING = object()


def _get(d: dict, key: str) -> object:
    for part in key.split("."):
        if not isinstance(d, dict) or part not in d:
            return _MISSING
        d = d[part]
    return d


def _set(d: dict, key: str, value: object) -> None:
    *parents, last = key.split(".")
    for part in parents:
        if not isinstance(d.get(part), dict):
            d[part] = {}
        d[part] = dict(d[part])  # the caller's nested dicts stay as they were
        d = d[part]
    if value is _MISSING:
        d.pop(last, None)
    else:
        d[last] = value


def ignored_saved_keys(saved: dict, used: dict) -> list[str]:
    """The ``COMMAND_LINE_ONLY`` keys (leaves, dotted) whose value in ``saved`` (a run's config.json)
    is not the one ``used``; a saved key that does not exist in ``used`` counts too."""
    out = []

    def walk(key: str, s: object, u: object) -> None:
        if isinstance(s, dict):
            for k, v in s.items():
                walk(f"{key}.{k}", v, u.get(k, _MISSING) if isinstance(u, dict) else _MISSING)
        elif s != u:
            out.append(key)

    for key in COMMAND_LINE_ONLY:
        s = _get(saved, key)
        if s is not _MISSING:
            walk(key, s, _get(used, key))
    return out


def announce_resume(cfg: ExperimentConfig) -> bool:
    """Print where a resumed run starts; True when there is nothing left to run.

    A checkpoint of the last round whose final outputs were not written (the coordinator died
    between the two) is finished here, without starting any process.
    """
    run_dir = cfg.resolved_run_dir()
    if not cfg.resume_from:
        print(
            f"fedserver: resume: no checkpoint in {run_dir} (stopped before round 0 was reported); "
            "starting the run from the beginning",
            flush=True,
        )
        return False
    ck = load_server_checkpoint(cfg.resume_from)
    last = last_round(cfg, dp_settings(cfg))  # before `rounds` when privacy.max_epsilon stops the run
    if ck.round < last:
        print(f"fedserver: resuming {run_dir} after round {ck.round} of {last}", flush=True)
        return False
    if (run_dir / "global_final.pt").is_file() and '"completed"' in _read(run_dir / "status.json"):
        print(f"fedserver: {run_dir} has completed all {last} rounds already; nothing to resume", flush=True)
        return True
    reporter = RoundReporter(cfg, None, ck.keys, ck.manifest_hash, metrics_rows=ck.metrics, elapsed_s=ck.elapsed_s)
    reporter.last_round = last
    reporter.metrics.write()  # the checkpoint's history is the reference
    reporter.finish(ck.arrays)
    print(f"fedserver: {run_dir} had completed all {last} rounds; final outputs written", flush=True)
    return True


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
