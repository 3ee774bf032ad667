"""A config dataclass from a plain dict, through OmegaConf's structured configs.

The dataclasses of ``common/config/`` hold every default and every type; OmegaConf merges a dict
(Hydra's composition, a run's ``config.json``, the run config a site receives) onto them, converts
what it can (``600`` -> ``600.0`` for a float) and refuses unknown keys and values of the wrong
type. Its errors are re-worded here into one line naming the key, what was expected and what was
found; range and choice checks stay in each dataclass's ``validate``.

A dict given as data is never interpolated: a value (or key) holding ``${`` is refused before the
merge, as OmegaConf would resolve it (``${oc.env:NAME}`` reads this process's environment) and a
site would return what it read to the coordinator in its error. The refusal names the key only.
Hydra's own composition (common/config/compose.py) resolves ``conf/`` before it gets here.
"""

from __future__ import annotations

import dataclasses
import re
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # omegaconf (~0.2 s) is imported where a config is built: a command's help needs none
    from omegaconf import DictConfig
    from omegaconf.errors import OmegaConfBaseException

T = TypeVar("T")
_CONVERSION = re.compile(r"Value '(?P<value>.*)' of type '(?P<type>[\w.]+)' could not be converted to (?P<to>\w+)")


@cache
def schema(cls: type) -> DictConfig:
    """The structured config of ``cls`` with its defaults (built once: merging copies it)."""
    from omegaconf import OmegaConf

    return OmegaConf.structured(cls)


def build(cls: type[T], d: Any, key: str = "") -> T:
    """``cls`` with the values of ``d`` over its defaults; ValueError naming the key otherwise.

    ``key`` is where ``d`` sits in the experiment (``engine.sites.market1501``), for the message.
    """
    if isinstance(d, cls):
        return d
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    refuse_interpolations(d, key)
    try:
        return OmegaConf.to_object(OmegaConf.merge(schema(cls), d or {}))  # type: ignore[return-value]
    except OmegaConfBaseException as e:
        raise config_error(e, key) from None


def refuse_interpolations(d: Any, key: str = "") -> None:
    """ConfigError naming the first key of ``d`` whose value or name holds ``${`` (the value itself is
    not in the message: it is not ours to repeat)."""
    items = d.items() if isinstance(d, dict) else enumerate(d) if isinstance(d, list | tuple) else ()
    for k, v in items:
        at = f"{key}.{k}" if key else str(k)
        if "${" in str(k) or (isinstance(v, str) and "${" in v):
            shown = at if "${" not in str(k) else (key or "<root>")
            raise ConfigError(
                f"config {shown}: expected a plain value, found an OmegaConf interpolation ('${{...}}'); "
                "a config given as data is never resolved"
            )
        refuse_interpolations(v, at)


class ConfigError(ValueError):
    """A configuration that does not fit the schema: unknown key, wrong type, unknown group option."""


def config_error(e: OmegaConfBaseException, key: str = "") -> ConfigError:
    """OmegaConf's multi-line error as ``config KEY: ...`` in one line (``key``: the prefix of ``e``'s)."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    full = ".".join(k for k in (key, e.full_key) if k) or "<root>"
    msg = str(getattr(e, "msg", "") or e).splitlines()[0]
    if isinstance(e, ConfigKeyError | ConfigAttributeError) and " not in " in msg:
        parent, _, leaf = full.rpartition(".")
        valid = [f.name for f in dataclasses.fields(e.object_type)] if dataclasses.is_dataclass(e.object_type) else []
        return ConfigError(f"config {parent or '<root>'}: unknown key(s) [{leaf!r}]; valid: {sorted(valid)}")
    m = _CONVERSION.fullmatch(msg)
    if m:
        return ConfigError(f"config {full}: expected {m['to'].lower()}, found {m['value']!r} ({m['type']})")
    return ConfigError(f"config {full}: {msg}")
