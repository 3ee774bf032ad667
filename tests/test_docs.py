"""Every command line in README.md and docs/ parses, without running it.

The shell code blocks of the pages are split into command lines; each project command is parsed by
the code its entry point uses: Hydra overrides are composed against the config schema
(``compose_experiment``: unknown keys, wrong types and invalid values fail), flags go through each
CLI's own argparse parser, ``make`` targets must exist. A command of no known program fails, so a
new kind of command in the docs is either checked here or listed as an outside tool.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from hydra.errors import HydraException
from omegaconf import OmegaConf

from common.config.compose import REPO_ROOT, compose_experiment, merge_overrides

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
SHELL = ("bash", "sh", "shell")
# programs that are not this project's: their lines are not parsed here
OUTSIDE = {"ray", "docker", "sudo", "apt-get", "pip", "flower-superlink", "tensorboard", "export", "cd"}
FENCE = re.compile(r"^```(\w*)\s*$")


def code_blocks(text: str) -> list[tuple[str, int, str]]:
    """(language, first line number, body) of every fenced block of a markdown page."""
    blocks, lang, start, body = [], None, 0, []
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line.strip())
        if lang is None and m:
            lang, start, body = m.group(1), n + 1, []
        elif lang is not None and line.strip() == "```":
            blocks.append((lang, start, "\n".join(body)))
            lang = None
        elif lang is not None:
            body.append(line)
    assert lang is None, f"a code block opened at line {start - 1} is not closed"
    return blocks


def command_lines(body: str, first: int) -> list[tuple[int, list[str]]]:
    """(line number, words) of each command of a shell block: continuations joined, comments dropped."""
    out, pending, at = [], "", first
    for n, line in enumerate(body.splitlines(), first):
        if not pending:
            at = n
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        words = shlex.split(pending + line, comments=True)
        pending = ""
        if words:
            out.append((at, words))
    return out


def documented_commands() -> list[tuple[str, list[str]]]:
    cases = []
    for page in PAGES:
        for lang, first, body in code_blocks(page.read_text()):
            if lang in SHELL:
                for n, words in command_lines(body, first):
                    cases.append((f"{page.relative_to(REPO_ROOT)}:{n}", words))
    return cases


def documented_yaml() -> list[tuple[str, str]]:
    return [
        (f"{page.relative_to(REPO_ROOT)}:{first}", body)
        for page in PAGES
        for lang, first, body in code_blocks(page.read_text())
        if lang == "yaml"
    ]


# ---- one checker per program


def _argparse(parser, words: list[str]) -> None:
    parser.parse_args(words)


def check_fedserver(words: list[str]) -> None:
    from server.deploy import admin

    parsers = {
        "certs": admin.certs_parser,
        "register-site": admin.register_site_parser,
        "list-sites": admin.list_sites_parser,
        "unregister-site": admin.unregister_site_parser,
    }
    assert set(parsers) == set(admin.SUBCOMMANDS), "a fedserver subcommand has no parser here"
    if words and words[0] in parsers:
        return _argparse(parsers[words[0]](), words[1:])
    from server.deploy.fedserver import split_command

    _, args = split_command([w for w in words if w != "--debug"])
    resume = [w for w in args if w.startswith("resume=")]
    if resume:  # merged onto the run's saved config: here onto the defaults, which have every key
        merge_overrides([w for w in args if w not in resume])
    else:
        compose_experiment(args)


def check_fedclient(words: list[str]) -> None:
    from client.deploy.fedclient import parser
    from client.deploy.keygen import parser as keygen_parser
    from client.deploy.site_keys import to_flags

    if words and words[0] == "keygen":
        return _argparse(keygen_parser(), words[1:])
    _argparse(parser(), to_flags(words))  # KEY=VALUE checked against the site's keys, then as its alias


def check_fedsim(words: list[str]) -> None:
    if "experiment=fedfr-demo" in words:  # fedsim hands these to the FedFR demo
        from server.demos.fedfr_demo import parse_args

        _, overrides = parse_args([w for w in words if w != "experiment=fedfr-demo"])
        compose_experiment(["experiment=fedfr-demo", *overrides])
        return
    from server.demos.fedsim import parse_args, server_overrides
    from server.deploy.local_federation import LocalSite

    a, overrides = parse_args(words)
    sites = [LocalSite(s, "market1501", Path("/data") / s, Path("/state") / s) for s in a.sites]
    # the FedAvg head's census reads the sites' data, which a parse check does not have: a stand-in size
    census = [] if any("fedavg_num_classes=" in o for o in overrides) else ["strategy.fedavg_num_classes=1"]
    compose_experiment(server_overrides(Path("runs/x"), sites, {}, a.engine, "127.0.0.1:9092", census + overrides))


def check_fedeval(words: list[str]) -> None:
    if "task=fedfr" in words:
        from server.fedfr.evaluate import run_config

        run_config([w for w in words if w != "task=fedfr"])
        return
    from server.fedreid.fedeval import parse_args

    parse_args(words)


def check_fedstudy(words: list[str]) -> None:
    from server.studies.fedstudy import STUDY_DIR, load_study, parser

    a, overrides = parser().parse_known_args(words)
    load_study(a.study, overrides)
    path = Path(a.study) if Path(a.study).is_file() else STUDY_DIR / f"{a.study}.yaml"
    keys = set(yaml.safe_load(path.read_text()))
    for o in overrides:
        key = o.partition("=")[0].split(".")[0]
        assert key in keys, f"fedstudy {a.study}: {o!r} sets {key!r}, which {path.name} does not have ({sorted(keys)})"
        if key == "overrides":  # the runs' Hydra overrides
            compose_experiment([str(x) for x in OmegaConf.to_container(OmegaConf.from_dotlist([o]))["overrides"]])


def check_python(words: list[str]) -> None:
    assert words[:1] == ["-m"], f"expected python -m MODULE, found {words}"
    module, rest = words[1], words[2:]
    if module == "common.config.reference":
        assert rest in ([], ["--check"]), rest
        return
    from common.datasets import face_split, insightface_rec

    tools: dict[str, Callable] = {
        "common.datasets.face_split": face_split.parser,
        "common.datasets.insightface_rec": insightface_rec.parser,
    }
    assert module in tools, f"python -m {module}: not a tool this test knows"
    _argparse(tools[module](), rest)


def _option_values(words: list[str], *names: str) -> list[str]:
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w in names]


def check_flwr(words: list[str]) -> None:
    """``flwr run . --run-config ... --federation-config ...``: the run config's keys are the app's
    (pyproject), its experiment composes as the ServerApp composes it, and the federation has one
    virtual SuperNode per site. Other ``flwr`` commands are Flower's own."""
    if words[:1] != ["run"]:
        return
    import tomllib

    from flwr.common.config import parse_config_args

    from common.config.flwr_run import compose_flwr_run

    declared = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    given = parse_config_args(_option_values(words, "--run-config", "-c"))
    assert set(given) <= set(declared), f"run config keys {sorted(set(given) - set(declared))} are not the app's"
    if not given.get("experiment"):
        return
    cfg = compose_flwr_run({**declared, **given})
    federation = parse_config_args(_option_values(words, "--federation-config"))
    assert federation.get("num-supernodes") == len(cfg.sites), (
        f"num-supernodes={federation.get('num-supernodes')}, the experiment has {len(cfg.sites)} sites"
    )


def make_targets() -> set[str]:
    text = (REPO_ROOT / "Makefile").read_text() + (REPO_ROOT / "docker" / "compose.mk").read_text()
    return set(re.findall(r"^([\w%-]+):(?!=)", text, flags=re.M))


def check_make(words: list[str]) -> None:
    targets = make_targets()
    goals = [w for w in words if "=" not in w]
    assert goals, "make with no target"
    for goal in goals:
        ok = goal in targets or any(t.endswith("%") and goal.startswith(t[:-1]) for t in targets)
        assert ok, f"make {goal}: no such target in Makefile or docker/compose.mk"


CHECKS: dict[str, Callable[[list[str]], None]] = {
    "fedserver": check_fedserver,
    "fedclient": check_fedclient,
    "fedsim": check_fedsim,
    "fedeval": check_fedeval,
    "fedstudy": check_fedstudy,
    "python": check_python,
    "make": check_make,
    "flwr": check_flwr,
}


# ---- the tests


def test_the_pages_hold_commands():
    programs = {words[0] for _, words in documented_commands()}
    assert {"fedserver", "fedclient", "fedsim", "fedeval", "fedstudy", "make"} <= programs
    readme = (REPO_ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme


@pytest.mark.parametrize(("where", "words"), documented_commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_documented_command_parses(where: str, words: list[str]):
    program, args = words[0], words[1:]
    if program in OUTSIDE:
        return
    assert program in CHECKS, f"{where}: {program!r} is neither a checked command nor an outside tool"
    try:
        CHECKS[program](args)
    except SystemExit as e:  # argparse and the tools' one-line refusals
        pytest.fail(f"{where}: {shlex.join(words)}\n  refused: {e}")
    except Exception as e:  # noqa: BLE001 - composition errors name the key
        pytest.fail(f"{where}: {shlex.join(words)}\n  {type(e).__name__}: {e}")


@pytest.mark.parametrize(("where", "body"), documented_yaml(), ids=lambda v: v if ":" in str(v) else "")
def test_documented_site_yaml_is_a_site_config(where: str, body: str, tmp_path, monkeypatch):
    from common.config.site import load_site

    d = yaml.safe_load(body)
    site = tmp_path / "site"
    site.mkdir()
    (tmp_path / "config.yaml").write_text("defaults: []\n")
    (site / f"{d['name']}.yaml").write_text(body)
    monkeypatch.setenv("FEDREID_CONF", str(tmp_path))
    cfg = load_site(d["name"])
    from common.datasets import READERS

    assert cfg.reader in READERS, f"{where}: reader {cfg.reader!r} not one of {sorted(READERS)}"


# ---- the checkers catch what they are for


@pytest.mark.parametrize(
    "line",
    [
        "fedserver trian.batch_size=4",  # unknown key
        "fedserver rounds=abc",  # wrong type
        "fedserver engine=simulation sites=[market1501,dukemtmc]",  # 4 sites awaited of 2
        "fedserver --insecure",  # a fedclient flag
        "fedclient --site market1501 --insecure --root-certificates ca.crt",  # exclusive
        "fedclient --site market1501 --batchsize 8",
        "fedclient site=market1501 rounds=3",  # the coordinator's key
        "fedclient site=market1501 train.batchsize=8",
        "fedserver certs --host x",  # out_dir missing
        "fedsim --engine simulation --sites 4 trian.batch_size=4",
        "fedsim --sites 40",  # numbered sites need --engine simulation
        "fedeval checkpoint=a.pt flipp=true",
        "fedeval task=fedfr fedfr.ijbc_fliip=true",
        "fedstudy fedreid-ablation rounds=100",  # not a key of the study file: silently ignored
        "fedstudy no-such-study",
        "python -m common.datasets.face_split src out --clients 4",  # --public missing
        "make no-such-target",
        "flwr run . --run-config 'experiment=\"demo\" rounds=2'",  # not a key of the app's run config
        "flwr run . --run-config 'experiment=\"demo\"' --federation-config 'num-supernodes=2'",  # 4 sites
        'flwr run . --run-config \'experiment="demo" overrides="trian.batch_size=4"\'',
    ],
)
def test_a_wrong_command_is_caught(line: str):
    words = shlex.split(line)
    with pytest.raises((SystemExit, AssertionError, ValueError, HydraException)):
        CHECKS[words[0]](words[1:])


def test_command_lines_join_continuations_and_drop_comments():
    body = "fedserver rounds=3 \\\n  strategy.fraction=0.5   # a comment\n\n# only a comment\nmake demo"
    assert command_lines(body, 10) == [(10, ["fedserver", "rounds=3", "strategy.fraction=0.5"]), (14, ["make", "demo"])]


LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_relative_links_point_at_files_and_headings():
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if re.match(r"^[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            assert dest.exists(), f"{page.relative_to(REPO_ROOT)}: link {target!r}: no {dest}"
            if anchor and dest.suffix == ".md":
                anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", dest.read_text(), flags=re.M)}
                assert anchor in anchors, f"{page.relative_to(REPO_ROOT)}: link {target!r}: no heading #{anchor}"


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")
