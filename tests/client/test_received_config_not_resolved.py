"""A site never evaluates expressions from the run config it receives: an OmegaConf interpolation
(``${oc.env:SITE_SECRET}``) in the site view is refused, not resolved, and what goes back to the
coordinator (the exception Flower turns into the error reply, the site process's error reply) is a
fixed reason with no value of the site's environment (common/config/run.py received_experiment)."""

from __future__ import annotations

import json
import logging

import pytest
from flwr.app import RecordDict
from flwr.common import Context

from client.app import client_fn
from client.flower.virtual_site import VirtualSites
from client.process.site_process import SiteHost
from common.config.run import RECEIVED_CONFIG_REFUSED, RUN_CONFIG_KEY, site_config
from tests.fakes import tiny_config

SECRET = "s1te-s3cret-7f2a"


def _views() -> list[dict]:
    """Site views with the interpolation where the schema wants an int, a string and a list."""
    out = []
    for path in (("rounds",), ("model", "backbone"), ("sites",)):
        view = tiny_config().site_view()
        node = view
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = "${oc.env:SITE_SECRET}" if path != ("sites",) else ["market1501", "${oc.env:SITE_SECRET}"]
        out.append(view)
    view = tiny_config().site_view()
    view["rounds"] = "\\${oc.env:SITE_SECRET}"  # escaped: still not ours to resolve or unescape
    return [*out, view]


@pytest.fixture(autouse=True)
def site_secret(monkeypatch):
    monkeypatch.setenv("SITE_SECRET", SECRET)


@pytest.mark.parametrize("case", range(4))
def test_the_clientapp_refuses_an_interpolation_with_a_fixed_reason(case):
    experiment = json.dumps(_views()[case])
    # the site's own log, read from its logger (whatever handlers an earlier test left on it)
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    site_log = logging.getLogger("fedclient")
    site_log.addHandler(handler)
    context = Context(
        run_id=1,
        node_id=7,
        node_config={"site": "market1501"},
        state=RecordDict(),
        run_config={RUN_CONFIG_KEY: experiment},
    )
    try:
        with pytest.raises(ValueError) as e:  # Flower puts str(e) in the error reply to the coordinator
            client_fn(context)
    finally:
        site_log.removeHandler(handler)
    assert str(e.value) == RECEIVED_CONFIG_REFUSED
    assert SECRET not in str(e.value) and SECRET not in repr(e.value.__cause__)
    log = "\n".join(r.getMessage() for r in records)  # the site's own log names the key, never a resolved value
    assert SECRET not in log and "OmegaConf interpolation" in log


@pytest.mark.parametrize("case", range(4))
def test_the_site_process_and_a_virtual_site_refuse_it_too(case):
    experiment = json.dumps(_views()[case])
    host = SiteHost({"site": "market1501"})
    with pytest.raises(ValueError) as e:  # site_process.serve sends f"{type}: {e}" back
        host.handle({"op": "get_properties", "experiment": experiment, "config": {}}, [])
    assert str(e.value) == RECEIVED_CONFIG_REFUSED and SECRET not in str(e.value)
    with pytest.raises(ValueError) as e:
        VirtualSites(lambda cfg, node: pytest.fail("built a site")).site(experiment, {"partition-id": 0})
    assert str(e.value) == RECEIVED_CONFIG_REFUSED
    with pytest.raises(ValueError, match="never resolved"):  # the schema's own refusal (site's log)
        tiny_config().from_json(experiment)


def test_a_plain_site_view_still_parses():
    view = tiny_config().site_view()
    assert site_config({RUN_CONFIG_KEY: json.dumps(view)}).site_view() == view
