"""Per-round metrics of a run: JSON + CSV files and a PNG plot of the curves."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from common.checkpoint import atomic_json_save, atomic_write_bytes
from server.run.tensorboard_log import TensorBoardLog


class MetricsLog:
    def __init__(self, run_dir: str | Path, rows: list[dict[str, Any]] | None = None, *, tensorboard: bool = False):
        self.run_dir = Path(run_dir)
        self.rows: list[dict[str, Any]] = list(rows or [])
        self.tensorboard = TensorBoardLog(self.run_dir) if tensorboard else None

    def add(self, row: dict[str, Any]) -> None:
        self.rows = [r for r in self.rows if r["round"] != row["round"]] + [row]
        self.rows.sort(key=lambda r: r["round"])
        self.write()
        if self.tensorboard is not None:
            self.tensorboard.add(row)

    def update(self, rnd: int, values: dict[str, Any]) -> None:
        """Add ``values`` to round ``rnd``'s row (a new row if there is none yet) and rewrite the files."""
        row = next((r for r in self.rows if r["round"] == rnd), None)
        if row is None:
            self.add({"round": rnd, **values})
            return
        row.update(values)
        self.write()

    def write(self) -> None:
        atomic_json_save(self.rows, self.run_dir / "metrics.json")
        keys: list[str] = []
        for r in self.rows:
            keys += [k for k in r if k not in keys and not isinstance(r[k], (dict, list))]
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(self.rows)
        atomic_write_bytes(self.run_dir / "metrics.csv", buf.getvalue().encode())

    def plot(self, path: str | Path | None = None) -> Path:
        """One panel per metric kind present: Rank-1 and mAP per target (Re-ID), TAR@FAR (FedFR)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        path = Path(path or self.run_dir / "curves.png")
        keys = sorted({k for r in self.rows for k in r if "/" in k})
        panels = [(kind, [k for k in keys if k.endswith("/" + kind)]) for kind in ("R1", "mAP")]
        panels.append(("TAR@FAR", [k for k in keys if k.split("/")[-1].startswith("TAR@FAR=")]))
        panels = [(kind, series) for kind, series in panels if series] or [("R1", [])]
        fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
        for ax, (kind, series) in zip(axes[0], panels):
            for key in series:
                pts = [(r["round"], r[key]) for r in self.rows if key in r]
                if pts:
                    xs, ys = zip(*pts)
                    label = key.split("/")[-1] if kind == "TAR@FAR" else key.split("/")[0]
                    ax.plot(
                        xs, [100 * y for y in ys], marker="o", lw=2.5 if key.startswith("mean/") else 1.2, label=label
                    )
            ax.set_xlabel("round")
            ax.set_ylabel(f"{kind} (%)")
            ax.set_title(f"{kind} of the global model per round")
            ax.grid(alpha=0.3)
            if series:
                ax.legend(fontsize=8)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        plt.close(fig)
        atomic_write_bytes(path, buf.getvalue())
        return path
