"""Corrupted-image screening shared by every reader.

Decoding every image when a reader is built is slow for the large sets (MSMT17: 126k files), so
readers only check names and folders by default. ``verify_images=True`` decodes each image once
(``PIL.Image.load``, which also catches truncated JPEGs) and raises ``CorruptImageError`` naming
the first bad file; ``skip_corrupt=True`` decodes too, drops the bad files and lets the reader
report them (``reader.corrupt_files`` / ``reader.num_corrupt``). Without either, a bad file is
found later by the data loader (``image_dataset.read_image`` names it), never as a wrong label.

Every image is opened through :func:`open_image`, which refuses a file whose header declares more
than ``MAX_PIXELS`` pixels before anything is decoded: a decompression bomb (a few kB of PNG that
decodes into gigabytes) becomes one line naming the file, as any other unreadable image.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from pathlib import Path

from PIL import Image

from common.datasets.base import DatasetLayoutError, Record

log = logging.getLogger(__name__)


class CorruptImageError(DatasetLayoutError):
    """An image file of a dataset cannot be decoded."""

    def __init__(self, dataset: str, expected: str, path: str | Path, reason: str):
        super().__init__(
            dataset,
            expected,
            path,
            f"corrupted or unreadable image ({reason}); replace the file, or pass "
            "skip_corrupt=True to skip and count unreadable images",
        )


# Pixels an image may declare: a 24-megapixel photograph (6000 x 4000) passes; decoded as RGB it
# takes at most 96 MiB. Re-ID crops, aligned faces and IJB-C frames are far smaller.
MAX_PIXELS = 1 << 25


class ImageTooLargeError(ValueError):
    """An image whose header declares more pixels than ``MAX_PIXELS`` (refused before decoding)."""


def open_image(path: str | Path, max_pixels: int = MAX_PIXELS) -> Image.Image:
    """``PIL.Image.open(path)`` (lazy: nothing decoded yet), refused with ImageTooLargeError when the
    header declares more than ``max_pixels`` pixels (the caller names the file). The caller closes
    the image (``with open_image(p) as im``)."""
    with warnings.catch_warnings():
        # PIL's own bomb check warns above its limit (89 M pixels) and raises above twice that;
        # ``max_pixels`` is lower, so the size test below decides and the warning is no news
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            im = Image.open(path)
        except Image.DecompressionBombError as e:
            raise ImageTooLargeError(f"{e}; expected at most {max_pixels:,} pixels") from None
    width, height = im.size
    if width * height > max_pixels:
        im.close()
        raise ImageTooLargeError(
            f"the header declares {width} x {height} = {width * height:,} pixels, "
            f"expected at most {max_pixels:,} (a decompression bomb, or not a dataset image)"
        )
    return im


def image_problem(path: str | Path) -> str | None:
    """Why ``path`` cannot be decoded as an image, or None when it decodes."""
    try:
        with open_image(path) as im:
            im.load()
    except (OSError, SyntaxError, ValueError) as e:  # UnidentifiedImageError is an OSError
        return f"{type(e).__name__}: {e}"
    return None


def screen_images(
    dataset: str,
    expected: str,
    lists: Sequence[list[Record]],
    *,
    verify: bool,
    skip_corrupt: bool,
) -> tuple[list[list[Record]], list[str]]:
    """Decode every image of ``lists`` when asked; returns the kept lists and the skipped paths.

    Nothing is opened unless ``verify`` or ``skip_corrupt``. A path shared by several lists
    (CUHK03 classic: query = gallery) is decoded once.
    """
    if not (verify or skip_corrupt):
        return [list(rs) for rs in lists], []
    bad: set[str] = set()
    seen: set[str] = set()
    for rs in lists:
        for r in rs:
            if r.path in seen:
                continue
            seen.add(r.path)
            why = image_problem(r.path)
            if why is None:
                continue
            if not skip_corrupt:
                raise CorruptImageError(dataset, expected, r.path, why)
            bad.add(r.path)
    if bad:
        log.warning("%s: skipped %d corrupted image(s), e.g. %s", dataset, len(bad), min(bad))
    return [[r for r in rs if r.path not in bad] for rs in lists], sorted(bad)
