"""A site refuses a coordinator that runs another model: the manifest hash in the fit config."""

from __future__ import annotations

from common.params import Manifest


def check_manifest_hash(config: dict, manifest: Manifest, *, site: str, model: str) -> None:
    """Raise ValueError unless the coordinator's ``manifest_hash`` (fit config) is this site's.

    ``model`` describes this site's model config for the error (backbone, sizes, mode).
    """
    their = str(config.get("manifest_hash", ""))
    if their != manifest.hash:
        raise ValueError(
            f"site {site}: the coordinator's model manifest {their!r} differs from this site's "
            f"{manifest.hash!r} ({model}); both sides must run the same model config"
        )
