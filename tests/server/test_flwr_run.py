"""`flwr run .` without fedserver: the experiment composed from the run config (ServerApp and
virtual ClientApps alike), fedserver's file first, and the one-line refusal (fast; the real run is
tests/e2e/test_flwr_run_e2e.py)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from client.flower.virtual_site import virtual_node_config
from common.config.experiment import ExperimentConfig
from common.config.flwr_run import DATA_DIR_KEY, OVERRIDES_KEY, compose_flwr_run, site_view_json
from common.config.run import ENV, EXPERIMENT_KEY, RUN_CONFIG_KEY, site_run_config, write_serverapp_config
from server.flower import flwr_run
from tests.fakes import tiny_config

REPO = Path(__file__).resolve().parents[2]
DEMO_SITES = ["market1501", "dukemtmc", "cuhk03", "msmt17"]


def run_config(**keys: str) -> dict[str, str]:
    """The run config Flower hands the apps: pyproject's defaults with the ``--run-config`` keys."""
    out = dict(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"])
    out.update({k.replace("_", "-"): v for k, v in keys.items()})
    return out


def test_pyproject_declares_the_run_config_keys():
    # `flwr run --run-config` refuses keys the app does not declare
    assert set(run_config()) == {RUN_CONFIG_KEY, EXPERIMENT_KEY, DATA_DIR_KEY, OVERRIDES_KEY}
    assert run_config()[EXPERIMENT_KEY] == ""  # no experiment unless the user names one


def test_the_demo_is_composed_with_every_virtual_sites_folders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths: the working folder of the simulation's processes
    rc = run_config(experiment="demo", data_dir="world", overrides="rounds=1 run_dir=out train.batch_size=8")
    cfg = compose_flwr_run(rc)
    assert (cfg.name, cfg.rounds, cfg.train.batch_size, cfg.engine.name) == ("demo", 1, 8, "simulation")
    assert cfg.sites == DEMO_SITES and cfg.strategy.min_available_sites == 4
    assert cfg.run_dir == str(tmp_path / "out")
    for s in DEMO_SITES:
        vs = cfg.engine.sites[s]
        assert (vs.reader, vs.data_root, vs.state_dir) == (
            "market1501",
            str(tmp_path / "world" / s),
            str(tmp_path / "out" / "state" / s),
        )
    assert {n: (t.reader, t.root) for n, t in cfg.eval.targets.items()} == {
        t: ("market1501", str(tmp_path / "world" / t)) for t in ("synth_a", "synth_b")
    }
    # partition id 2 of 4 virtual SuperNodes is the third site, reading its own folders
    node = virtual_node_config(cfg, {"partition-id": 2, "num-partitions": 4})
    assert (node["site"], node["data-root"]) == ("cuhk03", str(tmp_path / "world" / "cuhk03"))


def test_the_users_overrides_win_and_the_data_defaults_to_the_run_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc = run_config(
        experiment="demo", overrides=f"sites=[market1501,cuhk03] strategy.min_available_sites=1 run_dir={tmp_path}/r"
    )
    cfg = compose_flwr_run(rc)
    assert cfg.sites == ["market1501", "cuhk03"] and cfg.strategy.min_available_sites == 1
    assert cfg.engine.sites["cuhk03"].data_root == str(tmp_path / "r" / "data" / "cuhk03")
    assert set(cfg.engine.sites) == {"market1501", "cuhk03"}


def test_a_virtual_clientapp_composes_the_servers_site_view(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc = run_config(experiment="demo", data_dir=str(tmp_path / "w"), overrides="rounds=2")
    view = json.loads(site_view_json(rc))
    cfg = compose_flwr_run(rc)
    assert view == json.loads(json.dumps(cfg.site_view()))
    site = ExperimentConfig.from_json(site_view_json(rc))  # what client/flower/virtual_site.py parses
    assert site.rounds == 2 and site.engine.sites["msmt17"].data_root == str(tmp_path / "w" / "msmt17")
    assert "run_dir" not in view and "targets" not in view["eval"]  # coordinator paths stay out


def test_fedservers_file_comes_first(tmp_path):
    cfg = tiny_config(seed=5)
    path = write_serverapp_config(tmp_path, cfg)
    rc = {**run_config(experiment="demo"), **site_run_config(cfg)}
    got = flwr_run.serverapp_experiment(rc, {ENV: str(path)})
    assert got.to_dict() == cfg.to_dict()
    assert not flwr_run.composed_here(rc, {ENV: str(path)}) and flwr_run.composed_here(rc, {})


@pytest.mark.parametrize("rc", [run_config(), run_config(experiment="  "), {}])
def test_no_experiment_and_no_file_is_one_line_naming_fedserver(rc):
    with pytest.raises(RuntimeError) as e:
        flwr_run.serverapp_experiment(rc, {})
    text = str(e.value)
    assert "\n" not in text
    assert "`fedserver`" in text and "flwr run . --run-config 'experiment=\"demo\"'" in text


@pytest.mark.parametrize(
    ("keys", "line"),
    [
        ({"experiment": "nope"}, "flwr run: config: unknown experiment 'nope'; expected one of: "),
        (
            {"experiment": "demo", "overrides": "trian.batch_size=4"},
            "flwr run: config <root>: unknown key(s) ['trian']",
        ),
        ({"experiment": "demo", "overrides": "engine=deployment"}, "simulation engine (engine=simulation)"),
        ({"experiment": "demo", "overrides": "rounds='1"}, "flwr run: run config overrides: expected KEY=VALUE"),
    ],
)
def test_a_wrong_run_config_is_one_line(keys, line):
    with pytest.raises(RuntimeError) as e:
        flwr_run.serverapp_experiment(run_config(**keys), {})
    assert "\n" not in str(e.value) and line in str(e.value), str(e.value)
    if keys["experiment"] == "demo" and "engine" in keys["overrides"]:
        assert "fedserver" in str(e.value)


def test_the_demo_world_is_fedsims_and_in_the_composed_folders(tmp_path, monkeypatch):
    from server.demos import fedreid_demo as demo

    written = []
    monkeypatch.setattr(demo, "_write_once", lambda root, params, write: written.append(root) or root)
    monkeypatch.chdir(tmp_path)
    cfg = compose_flwr_run(run_config(experiment="demo", data_dir="d", overrides="sites=[market1501,msmt17]"))
    flwr_run.write_demo_world(cfg, tmp_path / "d")
    assert written == [tmp_path / "d" / n for n in ("market1501", "msmt17", "synth_a", "synth_b")]
    cfg.engine.sites["msmt17"].data_root = str(tmp_path / "elsewhere")
    with pytest.raises(RuntimeError, match="the composed run reads"):
        flwr_run.write_demo_world(cfg, tmp_path / "d")


class NodesGrid:
    """A Grid whose simulation registers ``n`` nodes after ``late`` polls."""

    def __init__(self, n: int, late: int = 2) -> None:
        self.n, self.late = n, late

    def get_node_ids(self) -> list[int]:
        self.late -= 1
        return list(range(1, self.n + 1)) if self.late < 0 else []


def test_the_federation_size_must_be_the_number_of_sites():
    cfg = tiny_config(sites=["a", "b", "c"], strategy={"min_available_sites": 3})
    flwr_run.check_federation_size(NodesGrid(3), cfg, poll_s=0.01)
    with pytest.raises(RuntimeError) as e:
        flwr_run.check_federation_size(NodesGrid(2), cfg, poll_s=0.01)
    assert str(e.value) == (
        "flwr run: the federation has 2 virtual SuperNodes, the experiment 3 sites ['a', 'b', 'c']: "
        "add --federation-config 'num-supernodes=3'"
    )


def test_another_experiments_sites_come_from_their_site_configs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = compose_flwr_run(run_config(experiment="fedreid", overrides="sites=[market1501,dukemtmc]"))
    assert cfg.strategy.min_available_sites == 2 and cfg.engine.name == "simulation"
    # conf/site/market1501.yaml: the reader and data root fedclient --site market1501 would use
    assert (cfg.engine.sites["market1501"].reader, cfg.engine.sites["market1501"].data_root) == (
        "market1501",
        "/data/market1501",
    )
    with pytest.raises(RuntimeError, match=r"^flwr run: virtual site 'nosuch': unknown site 'nosuch'"):
        flwr_run.serverapp_experiment(run_config(experiment="fedreid", overrides="sites=[nosuch]"), {})
