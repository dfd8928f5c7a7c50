"""Counter-based randomness shared by every augmentation: SplitMix64 keyed by (seed, epoch, index).

A sample's random stream is ``uniform(sample_key(seed, epoch, index), counter)``: a pure function,
so a sample gets the same draws whatever the thread count, the batch it lands in, or the point an
epoch was resumed from. ``csrc/augment.h`` implements the same arithmetic.
"""

from __future__ import annotations

__all__ = ["sample_key", "splitmix64", "uniform"]

_MASK64 = (1 << 64) - 1


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
