"""The metric keys a site may report, declared per task: everything else is dropped on arrival.

A reply's metrics go into the round's record, ``metrics.json``, the in-memory history and every
checkpoint. Without a list, one site could send 50,000 finite keys a round and grow all of them
without bound. Each task's strategy declares a :class:`SiteMetrics`: the names whose value is a
number, the names whose value is text (with a cap on its length) and so, by their count, a cap on
how many keys a reply can bring. :meth:`SiteMetrics.allowed` keeps those names and drops the others
(the strategy logs one line naming the site); the kept values are then type-checked
(``server/replies.check_metrics``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from server.strategy.replies import ReplyError

# what a site's ClientApp adds to any task's metrics when it forwards to a site process
# (client/process/forward.py) or times a per-message ClientApp (client/site.py)
PROCESS_TIMINGS = (
    "startup_seconds",
    "forward_seconds",
    "clientapp_seconds",
)


@dataclass(frozen=True)
class SiteMetrics:
    """The keys a task's sites may report: ``numbers`` (finite numbers) and ``texts`` (name -> the
    longest text allowed). A reply keeps at most ``len(numbers) + len(texts)`` keys."""

    numbers: frozenset[str]
    texts: Mapping[str, int] = field(default_factory=lambda: {"site": 64})  # site names: common/config SITE_NAME

    @property
    def max_keys(self) -> int:
        return len(self.numbers) + len(self.texts)

    def allowed(self, metrics: Mapping[str, Any], who: str) -> tuple[dict[str, Any], list[str]]:
        """(the allowed keys of ``metrics``, the names of the others, sorted); ReplyError when an
        allowed text is not text or is longer than its cap (its number keys are checked later)."""
        if not isinstance(metrics, Mapping):
            raise ReplyError(f"{who}: metrics are a {type(metrics).__name__}, expected a mapping name -> number")
        kept, dropped = {}, []
        for k, v in metrics.items():
            if k in self.numbers:
                kept[k] = v
            elif k in self.texts:
                if not isinstance(v, str) or len(v) > self.texts[k]:
                    shown = f"{len(v)} characters" if isinstance(v, str) else type(v).__name__
                    raise ReplyError(f"{who}: metric {k!r} is {shown}, expected text of at most {self.texts[k]}")
                kept[k] = v
            else:
                dropped.append(str(k))
        return kept, sorted(dropped)


def describe_dropped(names: list[str], shown: int = 3, width: int = 40) -> str:
    """``N key(s) not allowed for this task (e.g. 'a', 'b', ...)``: bounded whatever ``names`` holds."""
    sample = ", ".join(repr(n[:width]) for n in names[:shown])
    return f"{len(names)} metric key(s) not allowed for this task dropped (e.g. {sample}{', ...' if len(names) > shown else ''})"


# FedReID (client/site.py, client/fedreid/client.py and train.py): timings, then the round's training statistics
FEDREID_SITE_METRICS = SiteMetrics(
    numbers=frozenset(
        {
            *PROCESS_TIMINGS,
            "load_seconds",
            "train_seconds",
            "train_cpu_seconds",
            "save_seconds",
            "loss",
            "ce",
            "kd",
            "expert_ce",
            "acc",
            "steps",
        }
    )
)

# FedFR (client/site.py, client/fedfr/client.py and train.py): the weight N_i, timings, the round's statistics
FEDFR_SITE_METRICS = SiteMetrics(
    numbers=frozenset(
        {
            *PROCESS_TIMINGS,
            "own_images",
            "train_seconds",
            "loss",
            "cos",
            "con",
            "bce",
            "acc",
            "steps",
            "con_first",
            "hard_negatives",
            "lr",
        }
    )
)
