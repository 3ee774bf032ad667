"""The site's side of secure aggregation (``privacy.secure_aggregation``, docs/privacy.md): two
ClientApp mods around Flower's ``secaggplus_mod``.

- :func:`secure_aggregation_mod` runs Flower's ``secaggplus_mod`` on the messages of a SecAgg+ stage
  (its key exchange, the fit whose reply it masks, the unmasking) and passes every other message on
  (a run without secure aggregation, evaluation, queries).
- :func:`secure_update_mod`, inside it, turns the reply of a fit the coordinator marked for secure
  aggregation into what SecAgg+ sums (``common/secure_update.py``): the site's update (its trained
  parameters minus those it received) as one flat float vector, clipped to ``secagg_clip_norm`` when
  asked (client-level DP), multiplied by its ``secagg_scale``, with ``num_examples = 1`` (the weight
  is in the scale, under the mask). A marked fit that did not come through a SecAgg+ stage is refused:
  the update never leaves the site in the clear under a coordinator that asked for it masked.
  A site whose operator set ``privacy.require_secure_aggregation`` (node config
  ``require-secure-aggregation``) refuses every fit that did not come through a SecAgg+ stage, marked
  or not: it neither trains nor replies with an update under a coordinator that left secure
  aggregation off.
"""

from __future__ import annotations

import logging

from flwr.app import Context, Error, Message, MessageType
from flwr.client.mod import secaggplus_mod
from flwr.common import Code, Parameters, bytes_to_ndarray, ndarray_to_bytes

from client.flower.secagg_flower import carries_secagg_stage, fit_ins, fit_res, fit_res_content
from common.logs import setup_logging
from common.secure_update import clip_to_norm, flat_update, out_of_range

log = logging.getLogger("fedclient")

# fit config keys the coordinator sets under secure aggregation (server/strategy/secure_aggregation.py)
SCALE_KEY = "secagg_scale"
CLIP_NORM_KEY = "secagg_clip_norm"
DTYPE_KEY = "secagg_dtype"
RANGE_KEY = "secagg_clip_range"
REFUSED_CODE = 6  # flwr.common.constant.ErrorCode.MOD_FAILED_PRECONDITION
REQUIRE_KEY = "require-secure-aggregation"  # the site's switch in its node config (common/config/site.py)


def secure_aggregation_mod(message: Message, context: Context, call_next) -> Message:
    if message.has_content() and carries_secagg_stage(message.content):
        return secaggplus_mod(message, context, call_next)
    return call_next(message, context)


def secure_update_mod(message: Message, context: Context, call_next) -> Message:
    if message.metadata.message_type != MessageType.TRAIN or not message.has_content():
        return call_next(message, context)
    try:
        ins = fit_ins(message.content)
    except KeyError:  # not a fit instruction
        return call_next(message, context)
    site = context.node_config.get("site", "?")
    required = str(context.node_config.get(REQUIRE_KEY, "")).lower() == "true"
    if required and not carries_secagg_stage(message.content):
        return _refuse(
            message,
            f"site {site} refused the fit: privacy.require_secure_aggregation=true expects the fit through "
            "secure aggregation (SecAgg+), found a plain fit (the coordinator runs without "
            "privacy.secure_aggregation=true); nothing was trained, no update sent",
        )
    if SCALE_KEY not in ins.config:
        return call_next(message, context)
    if not carries_secagg_stage(message.content):
        return _refuse(
            message,
            f"site {site}: refused by the site: a fit marked for secure aggregation arrived outside a SecAgg+ stage",
        )
    reply = call_next(message, context)
    if reply.has_error():
        return reply
    res = fit_res(reply.content)
    if res.status.code != Code.OK:
        return reply
    if len(ins.parameters.tensors) != 1 or len(res.parameters.tensors) != 1:
        raise ValueError(
            f"secure aggregation: expected one packed array each way, found {len(ins.parameters.tensors)} "
            f"sent and {len(res.parameters.tensors)} trained"
        )
    received = bytes_to_ndarray(ins.parameters.tensors[0])
    trained = bytes_to_ndarray(res.parameters.tensors[0])
    update = flat_update(trained, received, str(ins.config[DTYPE_KEY]))
    update, _ = clip_to_norm(update, float(ins.config.get(CLIP_NORM_KEY, 0.0)))
    update *= float(ins.config[SCALE_KEY])
    clipped = out_of_range(update, float(ins.config[RANGE_KEY]))
    if clipped:  # said here only: a count in the reply would tell the coordinator about the update
        log.warning(
            "site %s: %d update values outside privacy.secagg_clip_range=%g are clipped by secure aggregation",
            context.node_config.get("site", "?"),
            clipped,
            float(ins.config[RANGE_KEY]),
        )
    res.parameters = Parameters(tensors=[ndarray_to_bytes(update)], tensor_type="numpy.ndarray")
    res.num_examples = 1
    return Message(fit_res_content(res), reply_to=message)


def _refuse(message: Message, why: str) -> Message:
    """The error reply in place of the fit's, said in one line in the site's log."""
    setup_logging("fedclient")  # the mod runs before client_fn, which sets up the site's log
    log.warning("%s", why)
    return Message(Error(code=REFUSED_CODE, reason=why), reply_to=message)
