"""FedFR's personalised evaluation at the sites, the coordinator's side (Flower's evaluate round).

Every ``fedfr.personal_every`` rounds and after the last one, :class:`SiteEvaluation` asks every
connected site to score the global model, its Theta_l and its personalised model [Theta_l, Pi_l]
on its own identities (``client/fedfr/site_evaluation.py``). A reply brings figures only; each is
checked on its own (the site it claims, the keys of this run's protocol, rates in [0, 1], counts
>= 0) and a bad one is dropped with one log line naming the site. The round's row of
``metrics.json`` gets ``personal/<row>/<metric>`` (the mean over the sites that replied, the
paper's average over clients) and ``site_eval`` (every site's figures and counts), and
``fedfr_site_eval.json`` holds the latest evaluation, which ``fedeval task=fedfr`` reports
(``server/fedfr/evaluate.py``). The coordinator reads no site's files.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from flwr.common import EvaluateIns, EvaluateRes, Parameters, Scalar
from flwr.server.client_proxy import ClientProxy

from common.checkpoint import atomic_json_save
from common.config.experiment import ExperimentConfig
from common.evaluation.fedfr_protocols import mean_over_sites
from common.evaluation.fedfr_site_scoring import SITE_COUNTS, SITE_ROWS, reply_keys
from server.run.reporting import RoundReporter
from server.strategy.replies import ReplyError, check_metrics
from server.strategy.site_metrics import SiteMetrics, describe_dropped

log = logging.getLogger("fedserver")

SITE_EVAL_FILE = "fedfr_site_eval.json"


def evaluation_round(server_round: int, every: int, last: int) -> bool:
    """Whether the sites score after ``server_round``: every ``every`` rounds (0: never) and the last."""
    return server_round == last or (every > 0 and server_round % every == 0)


def check_site_figures(metrics: Mapping[str, Scalar], allowed: SiteMetrics, who: str) -> dict[str, float]:
    """A site's evaluate metrics as floats: only this protocol's keys, rates in [0, 1], counts >= 0."""
    kept, dropped = allowed.allowed(metrics, who)
    if dropped:
        log.warning("%s: %s", who, describe_dropped(dropped))
    out = check_metrics(kept, who)
    for k, v in out.items():
        if k in SITE_COUNTS and v < 0:
            raise ReplyError(f"{who}: {k}={v:g}, expected a count >= 0")
        if k not in SITE_COUNTS and not 0.0 <= v <= 1.0:
            raise ReplyError(f"{who}: {k}={v:g}, expected a rate in [0, 1]")
    return out


def summarize(per_site: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """``{row: {metric: mean over the sites reporting that row}}`` from the sites' flat figures."""
    out = {}
    for row in SITE_ROWS:
        rows = {
            s: {k.split("/", 1)[1]: v for k, v in m.items() if k.startswith(row + "/")} for s, m in per_site.items()
        }
        rows = {s: m for s, m in rows.items() if m}
        if rows:
            out[row] = mean_over_sites(rows)
    return out


class SiteEvaluation:
    def __init__(self, cfg: ExperimentConfig, reporter: RoundReporter) -> None:
        self.every = cfg.fedfr.personal_every
        self.reporter = reporter  # its last_round (set when the run starts), its metrics log, the run's end
        reporter.completes_after_sites = True  # the run is completed once the last evaluation is in
        self.run_dir = Path(cfg.resolved_run_dir())
        self.allowed = SiteMetrics(numbers=frozenset(reply_keys(cfg.fedfr)))

    def configure(
        self, server_round: int, parameters: Parameters, named: dict[str, ClientProxy], config: dict[str, Scalar]
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        """An evaluate instruction for every connected site after an evaluation round, else none."""
        if not evaluation_round(server_round, self.every, self.reporter.last_round):
            return []
        if not named and server_round == self.reporter.last_round:
            log.warning("round %d: no site connected to score the personalised models", server_round)
            self.reporter.complete()
            return []
        ins = {**config, "server_round": server_round}
        return [(named[s], EvaluateIns(parameters, dict(ins))) for s in sorted(named)]

    def aggregate(
        self, server_round: int, results: list[tuple[str | None, EvaluateRes]], failures: int
    ) -> dict[str, Scalar]:
        """Check each reply, record the round's figures; the means as Flower's evaluate metrics."""
        per_site: dict[str, dict[str, float]] = {}
        for site, res in sorted(results, key=lambda t: str(t[0])):
            who = f"round {server_round}: the evaluation of site {site}"
            claimed = res.metrics.get("site") if isinstance(res.metrics, Mapping) else None
            try:
                if site is None or claimed != site:
                    raise ReplyError(f"{who}: the reply claims site {str(claimed)[:80]!r}")
                per_site[site] = check_site_figures(res.metrics, self.allowed, who)
            except ReplyError as e:
                log.warning("dropped %s", e)
        means = summarize(per_site)
        flat = {f"personal/{row}/{k}": v for row, m in means.items() for k, v in m.items()}
        self.reporter.flush()  # the round's own row first (evaluated on the reporter's thread)
        self.reporter.metrics.update(server_round, {**flat, "site_eval": per_site, "site_eval_failures": failures})
        atomic_json_save(
            {
                "round": server_round,
                "sites": sorted(per_site),
                "personalised": {SITE_ROWS[r]: m for r, m in means.items()},
                "personalised_per_site": {
                    SITE_ROWS[r]: {
                        s: {k.split("/", 1)[1]: v for k, v in m.items() if k.startswith(r + "/")}
                        for s, m in per_site.items()
                        if any(k.startswith(r + "/") for k in m)
                    }
                    for r in means
                },
                "counts": {s: {k: m[k] for k in SITE_COUNTS if k in m} for s, m in per_site.items()},
            },
            self.run_dir / SITE_EVAL_FILE,
        )
        log.info(
            "round %d: personalised evaluation at %d site(s)%s",
            server_round,
            len(per_site),
            "".join(f"; {SITE_ROWS[r]} " + _headline(m) for r, m in means.items()),
        )
        if server_round == self.reporter.last_round:
            self.reporter.complete()
        return flat


def _headline(m: dict[str, float]) -> str:
    return ", ".join(f"{k}={100 * v:.2f}" for k, v in m.items() if k.startswith(("TAR@FAR=0.001", "rank-1")))
