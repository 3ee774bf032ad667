"""curves.png: one panel per metric kind the rows hold, no empty panel (and no matplotlib warning)."""

import warnings

from PIL import Image

from server.run.metrics_log import MetricsLog


def _plot(tmp_path, rows):
    log = MetricsLog(tmp_path, rows)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. "No artists with labels found to put in legend"
        path = log.plot()
    return Image.open(path).size


def test_reid_rows_give_rank1_and_map_panels(tmp_path):
    rows = [
        {"round": r, "viper/R1": 0.1 * r, "viper/mAP": 0.05 * r, "mean/R1": 0.1 * r, "mean/mAP": 0.05 * r}
        for r in range(3)
    ]
    w, h = _plot(tmp_path, rows)
    assert (w, h) == (1100, 400)  # 2 panels x 5.5 in x 100 dpi


def test_fedfr_rows_give_rank1_and_tar_panels(tmp_path):
    rows = [
        {
            "round": r,
            "ijbc/R1": 0.9,
            "ijbc/TAR@FAR=0.001": 0.5 + 0.1 * r,
            "ijbc/TAR@FAR=0.01": 0.7,
            "ijbc/TPIR@FPIR=0.1": 0.8,
        }
        for r in range(3)
    ]
    w, _ = _plot(tmp_path, rows)
    assert w == 1100  # R1 + TAR@FAR, no empty mAP panel


def test_rows_without_metrics_give_one_empty_panel(tmp_path):
    w, _ = _plot(tmp_path, [{"round": 1, "sampled": 4}])
    assert w == 550
