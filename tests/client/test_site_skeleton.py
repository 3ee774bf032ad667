"""The site skeleton (client/site.py): a third task is its hooks alone, and runs the same either way.

The task here is least squares y ~ X w + b by full-batch gradient descent: ``w`` is shared, the
bias ``b`` is the site's own (kept in its state, never sent). Its rounds are checked against the
same descent written out in numpy, and a site process (the runtime holds the state, the modules
and the loader) against per-message sites (each round from the state on disk), bit for bit.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from client.runtime.settings import SiteSettings
from client.runtime.state import SiteStateStore
from client.site import SiteClient
from common.params import from_wire, prefix_manifest, to_wire
from tests.fakes import tiny_config

ROOT = Path(__file__).resolve().parents[2]
X = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32)
Y = (X @ np.array([1.0, -2.0, 0.5], np.float32) + 0.3).astype(np.float32)
LR, STEPS = 0.1, 3


class Line(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(3, 1, bias=False)
        self.own = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared(x).squeeze(1) + self.own


@dataclass
class LineState:
    site: str
    manifest_hash: str
    last_round: int = 0
    rounds_trained: int = 0
    model: dict[str, Any] | None = None
    history: list[dict[str, float]] = field(default_factory=list)


LINE_STATE = SiteStateStore(
    LineState, current="line.pt", previous="line.prev.pt", checks={"site": "site", "manifest_hash": "model manifest"}
)


@dataclass
class LineRound:
    model: Line
    opt: torch.optim.Optimizer
    loader: Any


class LineClient(SiteClient):
    store = LINE_STATE

    def __init__(self, cfg, settings):
        super().__init__(cfg, settings)
        self.manifest = prefix_manifest(Line(), ("shared.",))

    def build_key(self):
        return ("line", repr(self.cfg))

    def state_identity(self):
        return {"site": self.s.site, "manifest_hash": self.manifest.hash}

    def model_name(self):
        return "a line"

    def initial_model(self):
        return Line()

    def num_examples(self):
        return len(X)

    def prepare_round(self, st, parameters, server_round, config):
        model = self.runtime.module("model", Line, at=st.model if st else None, continues=True)
        with torch.no_grad():
            model.shared.weight.copy_(torch.from_numpy(parameters[0]))
        opt = self.runtime.optimizer(lambda: torch.optim.SGD(model.parameters(), lr=LR), saved=None, carried=False)
        loader = self.runtime.loader(
            lambda: TensorDataset(torch.from_numpy(X), torch.from_numpy(Y)),
            batch_size=len(X),
            num_workers=0,
            seed=self.round_seed(server_round, "loader"),
            indices=range(len(X)),
            drop_last=False,
        )
        return LineRound(model, opt, loader)

    def train_round(self, r):
        for _ in range(STEPS):
            for x, y in r.loader:
                r.opt.zero_grad()
                loss = ((r.model(x) - y) ** 2).mean()
                loss.backward()
                r.opt.step()
        return {"loss": loss.item()}

    def state_to_keep(self, st, r, stats, server_round):
        return LineState(
            site=self.s.site,
            manifest_hash=self.manifest.hash,
            last_round=server_round,
            rounds_trained=(st.rounds_trained if st else 0) + 1,
            model=self.runtime.snapshot(r.model.state_dict()),
            history=(st.history if st else []) + [{"round": server_round, **stats}],
        )


def descent(w: np.ndarray, b: float) -> tuple[np.ndarray, float]:
    """STEPS full-batch gradient steps of the mean squared error, in float64."""
    w, b = w.astype(np.float64).ravel(), float(b)
    for _ in range(STEPS):
        r = X @ w + b - Y
        w, b = w - LR * 2 * X.T @ r / len(X), b - LR * 2 * r.mean()
    return w, b


def settings(tmp_path: Path, held: bool) -> SiteSettings:
    return SiteSettings(site="market1501", data_root=str(tmp_path), state_dir=str(tmp_path), hold_state=held)


def test_a_task_of_hooks_alone_trains_its_rounds_the_same_held_or_from_disk(tmp_path):
    cfg = tiny_config()
    held = LineClient(cfg, settings(tmp_path / "held", True))
    man = held.manifest
    assert man.keys == ("shared.weight",)
    b = 0.0
    for rnd in (1, 2, 3):
        w0 = np.random.default_rng(rnd).normal(size=(1, 3)).astype(np.float32)  # the coordinator's
        config = {"server_round": rnd, "manifest_hash": man.hash}
        fresh = LineClient(cfg, settings(tmp_path / "fresh", False))  # a new ClientApp per message
        a, na, ma = fresh.fit(to_wire(man, [w0]), config)
        h, nh, mh = held.fit(to_wire(man, [w0]), config)
        sent_a, sent_h = from_wire(man, a, who="a"), from_wire(man, h, who="h")
        assert sent_a[0].tobytes() == sent_h[0].tobytes() and na == nh == 6 and ma["loss"] == mh["loss"]
        w, b = descent(w0, b)  # the own bias goes on from the last round; w from the coordinator
        np.testing.assert_allclose(sent_a[0].ravel(), w, rtol=1e-5, atol=1e-6)
        st = LINE_STATE.load(tmp_path / "fresh", site="market1501", manifest_hash=man.hash)
        assert (st.last_round, st.rounds_trained) == (rnd, rnd)
        assert float(st.model["own"]) == pytest.approx(b, abs=1e-6)  # kept at the site
        assert ma["site"] == "market1501" and ma["train_seconds"] >= 0
    held.close()
    kept = LINE_STATE.load(tmp_path / "held", site="market1501", manifest_hash=man.hash)
    assert torch.equal(kept.model["own"], st.model["own"])  # the held site wrote the same state


def test_a_site_refuses_another_model_before_anything_is_read(tmp_path):
    c = LineClient(tiny_config(), settings(tmp_path, False))
    w0 = np.zeros((1, 3), np.float32)
    with pytest.raises(ValueError, match="coordinator's model manifest '0000' differs .* \\(a line\\)"):
        c.fit(to_wire(c.manifest, [w0]), {"server_round": 1, "manifest_hash": "0000"})
    assert not any(tmp_path.iterdir())  # no state written


def test_a_site_not_in_the_run_is_refused():
    cfg = tiny_config()
    with pytest.raises(ValueError, match="site 'elsewhere' is not part of this run"):
        LineClient(cfg, dataclasses.replace(settings(Path("/nonexistent"), False), site="elsewhere"))


@pytest.mark.parametrize("task", ["fedreid", "fedfr"])
def test_task_code_never_sees_how_the_site_runs(task):
    """Holding state, modules and loaders is the runtime's (client/runtime/site_runtime.py), not a task's."""
    for path in sorted((ROOT / "client" / task).glob("*.py")):
        text = path.read_text()
        found = re.findall(r"hold_state|\bhold=|persistent=|HeldState|DeviceModules|RoundLoader|module_pool", text)
        assert not found, f"{path.relative_to(ROOT)}: {sorted(set(found))}"
