"""5-point face alignment to the ArcFace 112x112 template (what insightface's IJB-C evaluation does).

A face is aligned by the similarity transform (rotation, uniform scale, translation; least squares,
Umeyama) that maps its five landmarks — left eye, right eye, nose tip, left and right mouth
corner, in image pixels (x, y) — onto the template, then warped into a size x size crop with
bilinear interpolation and black outside the image. The estimate and the warp are scikit-image's
(``SimilarityTransform.from_estimate``, ``warp``), the library insightface's own alignment uses.

Template: the 96x112 SphereFace/ArcFace points with x shifted by +8 for 112 wide (docs/protocols.md);
for a size other than 112 they are scaled by size / 112. Pixel coordinates as OpenCV's: the centre
of pixel (row r, column c) is (x, y) = (c, r).
"""

from __future__ import annotations

import numpy as np
from skimage.transform import SimilarityTransform, warp

TEMPLATE_SIZE = 112
# (x, y) in a 112 x 112 crop: left eye, right eye, nose tip, left mouth corner, right mouth corner
ARCFACE_TEMPLATE = np.array(
    [[38.2946, 51.6963], [73.5318, 51.5014], [56.0252, 71.7366], [41.5493, 92.3655], [70.7299, 92.2041]],
    dtype=np.float64,
)


def template(size: int = TEMPLATE_SIZE) -> np.ndarray:
    """The five template points (5, 2) for a size x size crop."""
    return ARCFACE_TEMPLATE * (size / TEMPLATE_SIZE)


def alignment_transform(landmarks: np.ndarray, size: int = TEMPLATE_SIZE) -> SimilarityTransform:
    """The similarity transform image (x, y) -> crop (x, y) that best maps ``landmarks`` onto the template."""
    lm = np.asarray(landmarks, dtype=np.float64)
    if lm.shape != (5, 2) or not np.isfinite(lm).all():
        raise ValueError(f"expected 5 finite (x, y) landmarks, shape (5, 2); found shape {lm.shape}: {lm.tolist()}")
    tf = SimilarityTransform.from_estimate(lm, template(size))
    if not tf:
        raise ValueError(f"no similarity transform from the landmarks {lm.tolist()} to the template: {tf}")
    return tf


def align_face(image: np.ndarray, landmarks: np.ndarray, size: int = TEMPLATE_SIZE) -> np.ndarray:
    """The (size, size, C) aligned crop of an (H, W, C) or (H, W) uint8 image, uint8."""
    image = np.asarray(image)
    if image.ndim not in (2, 3) or image.dtype != np.uint8:
        raise ValueError(f"expected an (H, W[, C]) uint8 image, found shape {image.shape} dtype {image.dtype}")
    tf = alignment_transform(landmarks, size)
    # warp reads, for every output pixel, the input at inverse_map(output (x, y))
    out = warp(image, tf.inverse, output_shape=(size, size), order=1, mode="constant", cval=0.0, preserve_range=True)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)
