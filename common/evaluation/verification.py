"""1:1 face verification: TAR@FAR, exact, on impostor scores too many to hold in memory.

Definition (docs/protocols.md, "Face verification metrics"), for ``n`` impostor scores ``u`` and a
target false-accept rate ``a``:

    FAR(t) = #{i : u_i > t} / n                     (strictly greater: a score equal to t is rejected)
    t*(a)  = min { t : FAR(t) <= a }
    TAR    = #{genuine scores g_j > t*} / n_genuine

Why the minimum exists and what it is. ``FAR`` is a non-increasing step function that only changes
at impostor scores and is right-continuous there (at ``t = u_i`` the score ``u_i`` no longer counts),
so ``{t : FAR(t) <= a}`` is a closed half-line ``[t*, +inf)`` and ``t*`` is an impostor score.
With ``k = floor(a * n)`` (the number of false accepts allowed) and ``u_(1) >= u_(2) >= ...`` the
scores sorted in decreasing order:

    t* = u_(k+1)   (the (k+1)-th largest impostor score)      if k < n
    t* = -inf      (everything is accepted, TAR = 1)           if k >= n, i.e. a >= 1

Proof: at most k scores (u_(1)..u_(k)) can be strictly above u_(k+1), so FAR(u_(k+1)) <= a; any
t < u_(k+1) has at least k+1 scores above it, so FAR(t) > a. Ties need no special case: when
u_(k+1) is tied with scores above it, fewer than k scores are strictly above t*, and the achieved
FAR is below the target (it is reported as ``far``). When ``a * n < 1``, k = 0 and t* is the
largest impostor score (achieved FAR = 0).

Tiny example: impostors (0.1, 0.2, 0.3, 0.3, 0.9), n = 5.
  a = 0.2: k = 1, t* = u_(2) = 0.3, FAR = #{0.9}/5 = 0.2 (t just below 0.3 would give 3/5).
  a = 0.4: k = 2, t* = u_(3) = 0.3 (tied with u_(2)), FAR = 1/5 = 0.2 < 0.4.
  a = 0.1: k = 0, t* = u_(1) = 0.9, FAR = 0.
  Genuine scores (0.25, 0.3, 0.95) at a = 0.2: TAR = #{0.95}/3 = 1/3 (0.3 is not > 0.3).

The target is read as the decimal it prints as (``1e-06`` means 1/10**6, so k = floor(n / 10**6)),
not as its binary float (slightly below 1e-6, which would lose one false accept when 10**6 | n).

Streaming (FedFR's personalised protocol has ~630M impostor pairs per client): the (k+1)-th
largest scores for all targets are found by an exact radix selection over the float bits, in a
few passes over the scores, never holding them all:

1. Each score maps to an unsigned integer key with the same order (the IEEE-754 bits with the
   sign bit flipped for positives and all bits flipped for negatives; -0.0 is folded into +0.0).
2. Pass 1 counts ``n`` and a 65,536-bin histogram of the top 16 key bits. For each target, the
   bin holding rank k+1 is found by accumulating counts from the top; the number of scores in
   higher bins is exactly known.
3. Each later pass, for each target still open: if its bin holds at most ``collect_cap`` scores,
   those scores are collected and the exact value is picked from them (``np.partition``);
   otherwise the next 16 bits of the keys inside that bin are histogrammed, narrowing the bin.
   A bin narrowed to all the key bits holds copies of a single value, which is then the answer.
   Targets that fall in the same bin share the work.

So float32 scores take at most 2 passes (16 + 16 bits), float64 at most 4; a typical run is two
passes. Memory is a few chunk-sized temporaries (keys, digits), the 65,536-bin histograms, and at
most ``collect_cap`` scores per open bin. The
scores may be given as an array, a re-iterable of chunks (list/tuple of arrays), a callable that
returns a fresh iterator of chunks on every call (e.g. regenerating score blocks from features),
or a one-shot iterator/generator of chunks, which is spooled to a temporary file during the first
pass (disk, not memory: ``n * itemsize`` bytes in ``spool_dir``) so it can be read again.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import IO, Any, Self

import numpy as np

DEFAULT_FAR_TARGETS: tuple[float, ...] = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1)
DIGIT_BITS = 16  # bits of the key resolved per histogram pass (65,536 bins)
READ_CHUNK = 1 << 21  # elements per chunk when reading an array or the spool file
DEFAULT_COLLECT_CAP = 1 << 21  # at most this many scores are gathered per open bin

ScoreSource = np.ndarray | Iterable[np.ndarray] | Callable[[], Iterable[np.ndarray]]


@dataclass(frozen=True)
class FarThreshold:
    """The threshold of one FAR target and what it achieves on the impostor scores."""

    far_target: float
    threshold: float  # t*: the smallest t with FAR(t) <= far_target (-inf when far_target >= 1)
    false_accepts: int  # #{impostor scores > t*}
    num_impostors: int

    @property
    def far(self) -> float:
        """The achieved FAR(t*) (<= far_target; smaller when ties straddle t*)."""
        return self.false_accepts / self.num_impostors


@dataclass(frozen=True)
class OperatingPoint:
    """TAR at the threshold of one FAR target."""

    far_target: float
    threshold: float
    far: float  # achieved FAR(t*)
    tar: float  # #{genuine > t*} / n_genuine


def allowed_false_accepts(far_target: float, num_impostors: int) -> int:
    """k = floor(a * n), with ``a`` read as the decimal it prints as (exact rational arithmetic)."""
    a = float(far_target)
    if not a >= 0.0:  # also rejects NaN
        raise ValueError(f"FAR target must be a number >= 0, got {far_target!r}")
    if math.isinf(a):
        return num_impostors
    return math.floor(Fraction(repr(a)) * num_impostors)


def tar_at_far(
    genuine_scores: np.ndarray,
    impostor_scores: ScoreSource,
    far_targets: Sequence[float] = DEFAULT_FAR_TARGETS,
    **selection_options: Any,
) -> dict[float, float]:
    """``{far_target: TAR}`` with TAR = #{genuine > t*} / n_genuine and t* as in the module doc.

    ``impostor_scores``: an array or chunks (see the module docstring); ``selection_options`` go
    to :func:`far_thresholds` (``collect_cap``, ``spool_dir``).
    """
    points = verification_operating_points(genuine_scores, impostor_scores, far_targets, **selection_options)
    return {a: p.tar for a, p in points.items()}


def verification_operating_points(
    genuine_scores: np.ndarray,
    impostor_scores: ScoreSource,
    far_targets: Sequence[float] = DEFAULT_FAR_TARGETS,
    **selection_options: Any,
) -> dict[float, OperatingPoint]:
    """Threshold, achieved FAR and TAR for every target (see :func:`tar_at_far`)."""
    # float64 holds every float32/float16 value and integers below 2**53 exactly, so comparing
    # against t* (a value of the impostor dtype) is exact.
    genuine = np.sort(np.asarray(genuine_scores, dtype=np.float64).ravel())
    if genuine.size == 0:
        raise ValueError("no genuine scores: TAR is undefined")
    if np.isnan(genuine).any():
        raise ValueError("genuine scores contain NaN")
    thresholds = far_thresholds(impostor_scores, far_targets, **selection_options)
    points = {}
    for a, th in thresholds.items():
        # #{g > t} = n - #{g <= t}
        accepted = genuine.size - int(np.searchsorted(genuine, th.threshold, side="right"))
        points[a] = OperatingPoint(a, th.threshold, th.far, accepted / genuine.size)
    return points


def far_thresholds(
    impostor_scores: ScoreSource,
    far_targets: Sequence[float] = DEFAULT_FAR_TARGETS,
    *,
    collect_cap: int = DEFAULT_COLLECT_CAP,
    spool_dir: str | None = None,
) -> dict[float, FarThreshold]:
    """For each target a, t*(a) = the (floor(a*n)+1)-th largest impostor score (exact, streamed).

    See the module docstring for the definition, the proof, and the multi-pass selection.
    """
    targets = [float(a) for a in far_targets]
    for a in targets:
        allowed_false_accepts(a, 0)  # validates
    with _Passes(impostor_scores, spool_dir) as passes:
        return _select(passes, targets, collect_cap)


# ---- exact streamed selection -------------------------------------------------------------------


@dataclass(eq=False)  # identity, not value, equality: two targets may share every field
class _Open:
    """A target whose threshold lies in a bin of keys not yet resolved to one value."""

    target: float
    k: int  # false accepts allowed
    level: int  # key bits known = level * DIGIT_BITS
    prefix: int  # the known top bits of the key
    rank: int  # the wanted score is the rank-th largest inside the bin (1-based)
    above: int  # scores whose key is above the bin
    count: int  # scores inside the bin


def _select(passes: _Passes, targets: list[float], collect_cap: int) -> dict[float, FarThreshold]:
    digits = 1 << DIGIT_BITS
    hist = np.zeros(digits, dtype=np.int64)
    n = 0
    for x, key in passes.first():
        n += x.size
        hist += np.bincount(_digit(key, passes.nbits, 0), minlength=digits)
    if n == 0:
        raise ValueError("no impostor scores: FAR is undefined")

    result: dict[float, FarThreshold] = {}
    open_: list[_Open] = []
    for a in targets:
        k = allowed_false_accepts(a, n)
        if k >= n:  # everything may be accepted: t* = -inf
            result[a] = FarThreshold(a, -math.inf, n, n)
            continue
        b, above, rank = _locate(hist, k + 1)
        open_.append(_Open(a, k, 1, b, rank, above, int(hist[b])))

    while open_:
        # Bins narrowed to every key bit hold a single value.
        for o in [o for o in open_ if o.level * DIGIT_BITS == passes.nbits]:
            t = _key_to_value(o.prefix, passes.dtype)
            result[o.target] = FarThreshold(o.target, t, o.above, n)
            open_.remove(o)
        if not open_:
            break
        groups: dict[tuple[int, int], list[_Open]] = {}
        for o in open_:
            groups.setdefault((o.level, o.prefix), []).append(o)
        collect = {g for g, os_ in groups.items() if os_[0].count <= collect_cap}
        gathered: dict[tuple[int, int], list[np.ndarray]] = {g: [] for g in collect}
        hists = {g: np.zeros(digits, dtype=np.int64) for g in groups if g not in collect}
        seen = 0
        for x, key in passes.again():
            seen += x.size
            high: dict[int, np.ndarray] = {}
            for level, prefix in groups:
                if level not in high:
                    high[level] = key >> np.array(passes.nbits - level * DIGIT_BITS, key.dtype)
                inside = high[level] == prefix
                if (level, prefix) in collect:
                    gathered[(level, prefix)].append(x[inside])
                else:
                    sub = _digit(key[inside], passes.nbits, level)
                    hists[(level, prefix)] += np.bincount(sub, minlength=digits)
        if seen != n:
            raise ValueError(
                f"the impostor source gave {seen} scores on a later pass but {n} on the first: "
                "a callable source must return the same scores every time it is called"
            )
        still_open = []
        for g, os_ in groups.items():
            if g in collect:
                values = np.concatenate(gathered[g]) if gathered[g] else np.empty(0, passes.dtype)
                _check_count(values.size, os_[0].count)
                for o in os_:
                    # rank-th largest = (size - rank)-th smallest (0-based)
                    t = np.partition(values, values.size - o.rank)[values.size - o.rank]
                    false_accepts = o.above + int(np.count_nonzero(values > t))
                    result[o.target] = FarThreshold(o.target, float(t), false_accepts, n)
            else:
                h = hists[g]
                _check_count(int(h.sum()), os_[0].count)
                for o in os_:
                    b, above, rank = _locate(h, o.rank)
                    o.level += 1
                    o.prefix = (o.prefix << DIGIT_BITS) | b
                    o.above += above
                    o.rank = rank
                    o.count = int(h[b])
                    still_open.append(o)
        open_ = still_open
    return {a: result[a] for a in targets}


def _locate(hist: np.ndarray, rank: int) -> tuple[int, int, int]:
    """Bin b holding the rank-th largest element, #elements in bins above b, rank inside b."""
    from_top = np.cumsum(hist[::-1])  # from_top[j] = #elements in bins >= len - 1 - j
    j = int(np.searchsorted(from_top, rank, side="left"))  # first j with from_top[j] >= rank
    b = hist.size - 1 - j
    above = int(from_top[j] - hist[b])
    return b, above, rank - above


def _check_count(found: int, expected: int) -> None:
    if found != expected:
        raise ValueError(
            f"a bin held {expected} scores on one pass and {found} on the next: the impostor "
            "source must give the same scores on every pass"
        )


def _digit(key: np.ndarray, nbits: int, level: int) -> np.ndarray:
    """The ``level``-th 16-bit digit of the keys, from the top, as bincount-able ints."""
    shift = np.array(nbits - (level + 1) * DIGIT_BITS, key.dtype)
    d = (key >> shift) & np.array((1 << DIGIT_BITS) - 1, key.dtype)
    return d.view(np.int64) if d.dtype == np.uint64 else d.view(np.int32)


_INT = {np.dtype(np.float32): np.int32, np.dtype(np.float64): np.int64}
_UINT = {np.dtype(np.float32): np.uint32, np.dtype(np.float64): np.uint64}


def _value_to_key(x: np.ndarray) -> np.ndarray:
    """Order-preserving unsigned keys: u < v  <=>  key(u) < key(v) (for x without NaN).

    Positive floats: set the sign bit; negative floats: flip every bit (their magnitude order
    reverses). ``x + 0.0`` first turns -0.0 into +0.0 (IEEE-754 round-to-nearest), so equal values
    have equal keys.
    """
    x = x + x.dtype.type(0.0)
    nbits = x.dtype.itemsize * 8
    bits = x.view(_INT[x.dtype])
    flip = bits >> np.array(nbits - 1, bits.dtype)  # 0 for positive, all ones for negative
    flip |= np.array(np.iinfo(bits.dtype).min, bits.dtype)  # always flip the sign bit
    flip ^= bits
    return flip.view(_UINT[x.dtype])


def _key_to_value(key: int, dtype: np.dtype) -> float:
    nbits = dtype.itemsize * 8
    sign = 1 << (nbits - 1)
    bits = key ^ sign if key & sign else key ^ ((1 << nbits) - 1)
    return float(np.array(bits, dtype=_UINT[dtype]).view(dtype))


# ---- passes over the scores ---------------------------------------------------------------------


class _Passes:
    """Iterates (values, keys) chunk by chunk, as often as needed, whatever the source form.

    The work dtype is float32 when the first chunk is float32 or float16, else float64.
    """

    def __init__(self, source: ScoreSource, spool_dir: str | None):
        self._spool: IO[bytes] | None = None
        self._spool_dir = spool_dir
        self.dtype: np.dtype = np.dtype(np.float64)
        self.nbits = 64
        if isinstance(source, np.ndarray) or hasattr(source, "__array__"):
            array = np.asarray(source).ravel()
            self._fresh: Callable[[], Iterable[Any]] | None = lambda: (
                array[i : i + READ_CHUNK] for i in range(0, array.size, READ_CHUNK)
            )
        elif callable(source):
            self._fresh = source
        elif isinstance(source, Iterable):
            if iter(source) is source:  # one-shot: spool during the first pass
                self._fresh = None
                self._once: Iterator[Any] = iter(source)
            else:  # list, tuple or any re-iterable
                self._fresh = lambda: source
        else:
            raise TypeError(
                "impostor scores must be an array, an iterable of arrays, or a callable that "
                f"returns an iterable of arrays; got {type(source).__name__}"
            )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._spool is not None:
            self._spool.close()  # a TemporaryFile: deleted on close

    def first(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        chunks = self._fresh() if self._fresh is not None else self._once
        if self._fresh is None:
            # Closed (and so deleted) in __exit__, after the later passes have read it.
            self._spool = tempfile.TemporaryFile(dir=self._spool_dir)  # noqa: SIM115
        decided = False
        for chunk in chunks:
            x = np.asarray(chunk).ravel()
            if x.size == 0:
                continue
            if not decided:
                self.dtype = np.dtype(np.float32 if x.dtype in (np.float32, np.float16) else np.float64)
                self.nbits = self.dtype.itemsize * 8
                decided = True
            x = self._work(x)
            if np.isnan(x).any():
                raise ValueError("impostor scores contain NaN")
            if self._spool is not None:
                x.tofile(self._spool)
            yield x, _value_to_key(x)

    def again(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        if self._spool is None:
            assert self._fresh is not None
            for chunk in self._fresh():
                x = np.asarray(chunk).ravel()
                if x.size:
                    x = self._work(x)
                    yield x, _value_to_key(x)
            return
        self._spool.seek(0)
        while True:
            x = np.fromfile(self._spool, dtype=self.dtype, count=READ_CHUNK)
            if x.size == 0:
                return
            yield x, _value_to_key(x)

    def _work(self, x: np.ndarray) -> np.ndarray:
        if x.dtype == self.dtype:
            return x
        if self.dtype == np.float32 and x.dtype != np.float16:
            raise TypeError(
                f"impostor chunks mix dtypes: the first chunk was float32, a later one {x.dtype}; "
                "give every chunk the same dtype (or make the first one float64)"
            )
        if x.dtype.kind not in "fiub":
            raise TypeError(f"impostor scores must be real numbers, got dtype {x.dtype}")
        return x.astype(self.dtype)
