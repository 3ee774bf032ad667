"""The two pieces of Flower that the site's side of secure aggregation needs beyond its public mods
(``tests/client/test_secure_aggregation_mod.py`` pins both):

- the name of the config record that carries a SecAgg+ stage (``secaggplus_mod`` fails on a train
  message without it, so the ClientApp runs the mod only on messages that carry it), and the names of
  the stages and of their parameters in it (``client/flower/secagg_guard_mod.py`` checks them);
- Flower's conversion between a train message's content and its legacy ``FitIns`` / ``FitRes``, the
  form in which ``secaggplus_mod`` itself reads the reply it masks.
"""

from __future__ import annotations

from flwr.common import FitIns, FitRes, RecordDict
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.compat.common import recorddict_compat

SECAGG_RECORD = RECORD_KEY_CONFIGS  # the config record of a SecAgg+ stage
__all__ = ["SECAGG_RECORD", "Key", "Stage", "carries_secagg_stage", "fit_ins", "fit_res", "fit_res_content"]


def carries_secagg_stage(content: RecordDict) -> bool:
    return SECAGG_RECORD in content.config_records


def fit_ins(content: RecordDict) -> FitIns:
    return recorddict_compat.recorddict_to_fitins(content, keep_input=True)


def fit_res(content: RecordDict) -> FitRes:
    return recorddict_compat.recorddict_to_fitres(content, keep_input=True)


def fit_res_content(res: FitRes) -> RecordDict:
    return recorddict_compat.fitres_to_recorddict(res, keep_input=True)
