"""Counter-based randomness shared by every augmentation: SplitMix64 keyed by (seed, epoch, index).

A sample's random stream is ``uniform(sample_key(seed, epoch, index), counter)``: a pure function,
so a sample gets the same draws whatever the thread count, the batch it lands in, or the point an
epoch was resumed from. Every distribution the augmentations draw from is built here on that stream,
so the Python references and the engine (``csrc/common/rng.h``, the same arithmetic in the same
order) agree to the last bit:

- :func:`randint` ``(n)`` from one draw ``u``: ``min(int(u * n), n - 1)``;
- :func:`normal`: Box-Muller from two draws ``(u1, u2)``, cosine branch,
  ``sqrt(-2 log(1 - u1)) cos(2 pi u2)`` (the same libm calls in C++ and Python);
- :func:`permutation`: Fisher-Yates from ``n - 1`` draws;
- :func:`gamma` / :func:`beta`: Marsaglia-Tsang gamma variates and their ratio;
- :func:`uniform_float32` / :func:`uniform_int`: C++'s ``std::uniform_real_distribution<float>``
  and ``std::uniform_int_distribution<int>`` as MXNet's augmenter uses them.

Which counters each op draws is documented with the op (:mod:`fastload.transforms.pixel` lays out
a sample's counters).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "beta",
    "gamma",
    "normal",
    "permutation",
    "randint",
    "sample_key",
    "splitmix64",
    "uniform",
    "uniform_float32",
    "uniform_int",
]

_MASK64 = (1 << 64) - 1
_F32 = np.float32
_BELOW_ONE = _F32(np.nextafter(_F32(1.0), _F32(0.0)))
#: Attempts of :func:`gamma` before it gives up (acceptance is above 95% per attempt).
GAMMA_ATTEMPTS = 80


def splitmix64(x: int) -> int:
    """One step of SplitMix64: a bijective 64-bit mixer (Steele, Lea, Flood 2014)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def sample_key(seed: int, epoch: int, index: int) -> int:
    """The 64-bit key of one sample's random stream."""
    k = splitmix64(seed & _MASK64)
    k = splitmix64(k ^ (epoch & _MASK64))
    return splitmix64(k ^ (index & _MASK64))


def uniform(key: int, counter: int) -> float:
    """The ``counter``-th uniform double in [0, 1) of the stream ``key`` (53 random bits)."""
    return (splitmix64((key + counter) & _MASK64) >> 11) * (1.0 / 9007199254740992.0)


def randint(key: int, counter: int, n: int) -> int:
    """A uniform integer in ``[0, n)`` from one draw."""
    return min(int(uniform(key, counter) * n), n - 1)


def normal(key: int, counter: int) -> float:
    """A standard normal from the draws ``counter`` and ``counter + 1`` (Box-Muller, cosine branch)."""
    u1 = uniform(key, counter)
    u2 = uniform(key, counter + 1)
    return math.sqrt(-2.0 * math.log(1.0 - u1)) * math.cos(2.0 * math.pi * u2)


def permutation(key: int, counter: int, n: int) -> list[int]:
    """A uniform permutation of ``range(n)`` from the draws ``counter .. counter + n - 2`` (Fisher-Yates)."""
    perm = list(range(n))
    for step, i in enumerate(range(n - 1, 0, -1)):
        j = randint(key, counter + step, i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def gamma(key: int, counter: int, alpha: float) -> float:
    """Gamma(alpha, 1) from the draws ``counter ..`` (Marsaglia-Tsang).

    For ``alpha < 1`` the ``U^(1/alpha)`` boost comes from ``counter``; attempt ``t`` draws a normal
    from ``counter + 1 + 3t`` and ``+ 2 + 3t`` and its acceptance from ``+ 3 + 3t``. After
    :data:`GAMMA_ATTEMPTS` rejections (not reached in practice) it returns ``alpha``, the mean.
    """
    boost = 1.0
    a = alpha
    if a < 1.0:
        boost = (1.0 - uniform(key, counter)) ** (1.0 / a)
        a += 1.0
    d = a - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    for t in range(GAMMA_ATTEMPTS):
        base = counter + 1 + 3 * t
        z = normal(key, base)
        v = 1.0 + c * z
        if v <= 0.0:
            continue
        v = v * v * v
        u = 1.0 - uniform(key, base + 2)  # (0, 1]
        if math.log(u) < 0.5 * z * z + d - d * v + d * math.log(v):
            return d * v * boost
    return alpha


def beta(key: int, counter_x: int, counter_y: int, alpha: float) -> float:
    """Beta(alpha, alpha): ``x / (x + y)`` of the gamma variates drawn from ``counter_x`` and ``counter_y``."""
    x = gamma(key, counter_x, alpha)
    y = gamma(key, counter_y, alpha)
    return 0.5 if x + y == 0.0 else x / (x + y)


def uniform_float32(key: int, counter: int) -> np.float32:
    """``std::uniform_real_distribution<float>(0, 1)``: the draw rounded to float32, kept below 1."""
    u = _F32(uniform(key, counter))
    return _BELOW_ONE if u >= _F32(1.0) else u


def uniform_int(key: int, counter: int, lo: int, hi: int) -> int:
    """``std::uniform_int_distribution<int>(lo, hi)``: every integer of ``[lo, hi]`` equally likely."""
    return min(hi, lo + int(uniform(key, counter) * (hi - lo + 1)))
