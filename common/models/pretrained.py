"""ImageNet initialisation of the shared embedding (FedReID: "ResNet-50 pre-trained on ImageNet").

``model.pretrained`` chooses where the coordinator's initial embedding comes from (the sites get
it with round 1, Eq. 7, so only the coordinator reads the weights):

- ``imagenet`` (the paper's preset): torchvision's own weights API
  (``ResNet50_Weights.IMAGENET1K_V1`` for resnet50); the file is fetched once into the torch
  cache (``$TORCH_HOME/hub/checkpoints``) and read from there afterwards, as every Re-ID codebase does;
- ``/path/to/resnet50.pth``: a torchvision ResNet state_dict on disk (an offline coordinator),
  read with ``torch.load(weights_only=True)``;
- ``none``: random initialisation, only as an explicit choice (the CPU demo); it is printed as a
  warning and recorded in config.json and metrics.json (``embedding_init``).

Weights that can be neither found nor fetched are an error that names both ways out; there is
never a silent random start.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn
from torchvision import models

from common.config.experiment import normalize_pretrained

log = logging.getLogger("fedserver")

# backbone -> torchvision's ImageNet weights (the weights API: URL, file name and hash in one place)
IMAGENET_WEIGHTS = {
    "resnet18": models.ResNet18_Weights.IMAGENET1K_V1,
    "resnet34": models.ResNet34_Weights.IMAGENET1K_V1,
    "resnet50": models.ResNet50_Weights.IMAGENET1K_V1,
}
CHOICES = ("imagenet", "none")  # or a path to a .pth file


class PretrainedWeightsError(RuntimeError):
    """The configured initial weights can be neither found nor fetched, or do not fit the backbone."""


def describe_init(choice: str | None) -> str:
    """What ``embedding_init`` records: ``imagenet``, ``file:<path>`` or ``random``."""
    c = normalize_pretrained(choice)
    return {"imagenet": "imagenet", "none": "random"}.get(c, f"file:{c}")


def warn_if_random(choice: str | None, who: str = "model.pretrained") -> bool:
    """Print (stderr, via logging) that the embedding starts from random weights; True when it does."""
    if normalize_pretrained(choice) != "none":
        return False
    log.warning(
        "%s=none: the embedding starts from RANDOM weights, not the paper's ImageNet "
        "initialisation (recorded as embedding_init=random in config.json and metrics.json)",
        who,
    )
    return True


def _fetch_imagenet(weights: models.WeightsEnum) -> dict[str, torch.Tensor]:
    # torchvision's weights API: read from the torch cache, fetched into it once when absent
    return weights.get_state_dict(progress=False, check_hash=True)


def backbone_state_dict(backbone: str, choice: str) -> dict[str, torch.Tensor]:
    """The torchvision ResNet state_dict that ``choice`` (``imagenet`` or a path) names for ``backbone``."""
    choice = normalize_pretrained(choice)
    if choice == "none":
        raise ValueError("model.pretrained=none has no weights to load")
    if choice == "imagenet":
        if backbone not in IMAGENET_WEIGHTS:
            raise PretrainedWeightsError(
                f"model.pretrained=imagenet: no ImageNet weights known for backbone "
                f"{backbone!r}; valid: {sorted(IMAGENET_WEIGHTS)}"
            )
        weights = IMAGENET_WEIGHTS[backbone]
        cache = Path(torch.hub.get_dir()) / "checkpoints"
        try:
            return _fetch_imagenet(weights)
        except Exception as e:
            name = weights.url.rsplit("/", 1)[-1]
            raise PretrainedWeightsError(
                f"model.pretrained=imagenet: torchvision's {backbone} ImageNet weights ({name}) are neither in the "
                f"torch cache ({cache}) nor could they be fetched from {weights.url} ({type(e).__name__}: {e}). "
                f"Either (1) let this machine fetch them once (or copy {name} into {cache}), or (2) give the file "
                f"on disk: model.pretrained=/path/to/{name}. (model.pretrained=none starts from random weights, "
                "which is not the paper's setting.)"
            ) from e
    path = Path(choice).expanduser()
    if not path.is_file():
        raise PretrainedWeightsError(
            f"model.pretrained: weights file not found: {path} (expected a torchvision {backbone} state_dict .pth). "
            "Either give the right path, or model.pretrained=imagenet to use torchvision's ImageNet weights "
            "(fetched once into the torch cache)."
        )
    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise PretrainedWeightsError(f"model.pretrained: {path} holds a {type(state).__name__}, expected a state_dict")
    return state


def load_backbone_weights(net: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Copy a torchvision ResNet state_dict into ``net`` (the trunk without its classifier).

    The ImageNet classifier ``fc.*`` is not part of the embedding (Eq. 1) and is ignored; every
    other key must be present with the right shape, or nothing is loaded.
    """
    own = {k: v for k, v in net.state_dict().items() if not k.startswith("fc.")}
    theirs = {k.removeprefix("module."): v for k, v in state.items()}
    theirs = {k: v for k, v in theirs.items() if not k.startswith("fc.")}
    missing, unexpected = sorted(set(own) - set(theirs)), sorted(set(theirs) - set(own))
    wrong = sorted(k for k in set(own) & set(theirs) if tuple(own[k].shape) != tuple(theirs[k].shape))
    if missing or unexpected or wrong:
        raise PretrainedWeightsError(
            f"model.pretrained: {source} does not fit the configured backbone: {len(missing)} missing key(s) "
            f"{missing[:3]}, {len(unexpected)} unexpected {unexpected[:3]}, {len(wrong)} of another shape {wrong[:3]}"
        )
    with torch.no_grad():
        for k, v in own.items():
            v.copy_(theirs[k].to(v.dtype))


def init_embedding(embedding: nn.Module, backbone: str, choice: str | None) -> str:
    """Initialise ``embedding.net`` as ``model.pretrained`` says; returns what ``describe_init`` records."""
    choice = normalize_pretrained(choice)
    if choice != "none":
        load_backbone_weights(embedding.net, backbone_state_dict(backbone, choice), choice)
        log.info("embedding initialised from %s", describe_init(choice))
    else:
        warn_if_random(choice)
    return describe_init(choice)
