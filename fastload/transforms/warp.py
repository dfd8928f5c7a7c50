"""The one-pass warp resampler (numpy reference): every output pixel sampled once from the source.

Geometries with a rotation, shear or free scale (:class:`~fastload.transforms.affine.RandomAffine`
after a crop, :class:`~fastload.transforms.mxnet_augment.MXNetDefaultAugment`) are described per
sample by a :class:`WarpPlan`: where each output pixel's centre lands in the decoded image, which
interpolation kernel samples it there, and what fills the pixels that land outside. The C++ engine
(``csrc/warp/warp.h``) evaluates the same plan with the same tap rules; this module is the reference it
is tested against, and the Pillow path's implementation.

Coordinates follow Pillow: source pixel ``j`` covers ``[j, j + 1)``, its centre is ``j + 0.5``, and
output pixel ``(x, y)`` is represented by its centre ``(x + 0.5, y + 0.5)``. A plan maps that centre
in two affine steps:

1. ``to_frame`` takes it to the *frame* (the intermediate image a two-pass pipeline would have
   produced: torchvision's resized crop before ``RandomAffine``, or MXNet's image after its resize
   and affine warp, before ``pad``). A point outside ``frame`` gets ``fill``. With ``snap`` the point
   moves to the centre of the frame pixel containing it (nearest-neighbour lookups in the frame).
2. ``to_source`` takes the frame point to the source position ``(u, v)``, which is sampled with
   ``kernel`` (separable taps per axis, weights normalised to sum to one):

   - ``LINEAR`` (triangle, radius 1), ``CUBIC`` (Keys, a = -0.5: Pillow/torchvision bicubic),
     ``CUBIC_CV`` (a = -0.75: OpenCV ``INTER_CUBIC``), ``LANCZOS4`` (OpenCV, radius 4): the weight
     of source pixel ``j`` is ``K((j + 0.5 - u) / s)``, normalised, where ``s = max(1, scale)``
     when ``antialias`` (Pillow's support-scaled filters) and 1 otherwise; at ``s = 1`` the
     linear and cubic weights are the classic interpolation ones, ``(1 - f, f)`` and Keys' four
     with the last one ``1`` minus the others, ``f = u - 0.5 - floor(u - 0.5)`` (OpenCV's form);
   - ``AREA``: the overlap of pixel ``j`` with the output pixel's footprint ``[u - scale/2,
     u + scale/2)`` (OpenCV ``INTER_AREA``);
   - ``NEAREST``: pixel ``floor(u + nearest_shift + 1e-6)`` (the epsilon puts positions that are
     an exact pixel edge in exact arithmetic, such as OpenCV's ``30 * 2.3``, on the pixel OpenCV
     picks, whatever the rounding of the composed map).

   Taps outside the source follow ``border``: ``DROP`` leaves them out and renormalises the rest
   (Pillow's resize), ``REPLICATE`` repeats the edge pixel (OpenCV's resize), ``CONSTANT`` reads
   ``fill`` (OpenCV's ``warpAffine``).

Arithmetic (the engine's, bit for bit): plain bilinear on both axes is integer interpolation at
positions rounded to 1/256 pixel with 8-bit weights (exact, and OpenCV's own result for its 1/32-pixel
warp positions); the other kernels take positions to 1/256 pixel too, read their weights from a
per-phase table (``_phase_taps``), round them to 14 fractional bits and accumulate in integers;
results are rounded half up and clamped to 0..255.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastload.engine_abi import WarpBorder, WarpKernel

__all__ = [
    "NEAREST_EPSILON",
    "PHASES",
    "WEIGHT_BITS",
    "Affine2",
    "Border",
    "Kernel",
    "WarpPlan",
    "apply_point",
    "compose",
    "gather_frame",
    "kernel_radius",
    "uses_crop_frame",
    "warp_image",
]

#: Added to NEAREST positions (see the module docstring).
NEAREST_EPSILON = 1e-6

#: A 2x3 affine map ``(a, b, c, d, e, f)``: ``x' = a x + b y + c``, ``y' = d x + e y + f``.
Affine2 = tuple[float, float, float, float, float, float]


#: Interpolation kernels (one definition with the engine's: fastload/engine_abi.py).
Kernel = WarpKernel
#: What taps outside the source read (one definition with the engine's: fastload/engine_abi.py).
Border = WarpBorder


def compose(outer: Affine2, inner: Affine2) -> Affine2:
    """``outer`` after ``inner``: the map ``p -> outer(inner(p))``."""
    a, b, c, d, e, f = outer
    p, q, r, s, t, u = inner
    return (a * p + b * s, a * q + b * t, a * r + b * u + c, d * p + e * s, d * q + e * t, d * r + e * u + f)


def apply_point(m: Affine2, x, y):
    """``m`` applied to the point ``(x, y)`` (scalars or arrays), as ``a x + (b y + c)``.

    The grouping is the engine's, which computes ``b y + c`` once per output row.
    """
    return (m[0] * x + (m[1] * y + m[2]), m[3] * x + (m[4] * y + m[5]))


@dataclass(frozen=True)
class WarpPlan:
    """How one sample's output pixels are taken from its decoded image (see the module docstring).

    Attributes:
        out_h: Output height.
        out_w: Output width.
        to_frame: Output pixel centre -> frame point.
        frame: ``(x0, y0, x1, y1)``: frame points outside it get ``fill``; None: no frame test.
        snap: Move each frame point to the centre of the frame pixel containing it.
        to_source: Frame point -> source position (full-resolution source pixels).
        scale: ``(sx, sy)``: source pixels per output pixel along each source axis, which sizes the
            antialiasing support and the AREA footprint.
        kernel: :class:`Kernel`.
        antialias: Widen the kernel by ``max(1, scale)`` (Pillow's resize filters).
        nearest_shift: ``(dx, dy)`` added to the source position before NEAREST takes its pixel.
        border: :class:`Border`.
        fill: RGB value of the pixels outside the frame (and of CONSTANT taps).
        dct_scaling: The engine may decode the source at 1/2, 1/4 or 1/8 scale where the plan
            still shrinks it 4x (at 1/2) or 5x (deeper) afterwards (the crop path's rule; kernels that low-pass,
            where a box pre-reduction keeps the result close: antialiased ones and AREA).
        quantize: Evaluate ``to_source`` as ``cv::warpAffine`` does: fixed point with 10
            fractional bits, positions rounded down to 1/32 pixel (to the nearest pixel for
            NEAREST), so a warp of the full-resolution source lands where OpenCV's does.
    """

    out_h: int
    out_w: int
    to_frame: Affine2
    frame: tuple[float, float, float, float] | None
    snap: bool
    to_source: Affine2
    scale: tuple[float, float]
    kernel: Kernel
    antialias: bool
    nearest_shift: tuple[float, float]
    border: Border
    fill: tuple[int, int, int]
    dct_scaling: bool
    quantize: bool = False

    @property
    def composite(self) -> Affine2:
        """Output pixel centre -> source position, when ``snap`` is off."""
        return compose(self.to_source, self.to_frame)

    def engine_fields(self) -> dict[str, Any]:
        """The plan as the engine's ``WarpPlan`` fields (fastload/engine_abi.py)."""
        fields: dict[str, Any] = {
            "out_h": self.out_h,
            "out_w": self.out_w,
            "to_frame": dict(zip("abcdef", self.to_frame, strict=True)),
            "snap": self.snap,
            "to_source": dict(zip("abcdef", self.to_source, strict=True)),
            "scale_x": self.scale[0],
            "scale_y": self.scale[1],
            "kernel": self.kernel,
            "antialias": self.antialias,
            "shift_x": self.nearest_shift[0],
            "shift_y": self.nearest_shift[1],
            "border": self.border,
            "fill": self.fill,
            "dct_scaling": self.dct_scaling,
            "quantize": self.quantize,
        }
        if self.frame is not None:
            fields.update(has_frame=True, frame=self.frame)
        return fields


def kernel_radius(kernel: Kernel) -> float:
    """Support radius of ``kernel`` in filter units (0 for NEAREST; AREA's depends on the scale)."""
    return {
        Kernel.NEAREST: 0.0,
        Kernel.LINEAR: 1.0,
        Kernel.CUBIC: 2.0,
        Kernel.CUBIC_CV: 2.0,
        Kernel.LANCZOS4: 4.0,
        Kernel.AREA: 0.5,
    }[Kernel(kernel)]


def _cubic(d: np.ndarray, a: float) -> np.ndarray:
    d = np.abs(d)
    near = ((a + 2.0) * d - (a + 3.0)) * d * d + 1.0
    far = ((a * d - 5.0 * a) * d + 8.0 * a) * d - 4.0 * a
    return np.where(d < 1.0, near, np.where(d < 2.0, far, 0.0))


def _lanczos4(d: np.ndarray) -> np.ndarray:
    d = np.asarray(d, np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        w = np.sin(np.pi * d) * np.sin(np.pi * d / 4.0) / (np.pi * np.pi * d * d / 4.0)
    return np.where(np.abs(d) < 1e-12, 1.0, np.where(np.abs(d) < 4.0, w, 0.0))


#: Positions are taken to 1/PHASES of a pixel by the tabulated kernels (and the integer bilinear).
PHASES = 256
#: Fixed-point bits of the tabulated kernels' weights.
WEIGHT_BITS = 14


def _filter_width(kernel: Kernel, scale: float, antialias: bool) -> float:
    return max(1.0, scale) if antialias and kernel not in (Kernel.NEAREST, Kernel.AREA) else 1.0


def _tap_count(kernel: Kernel, scale: float, antialias: bool) -> int:
    fs = _filter_width(kernel, scale, antialias)
    if kernel == Kernel.AREA:
        return math.ceil(scale) + 1
    if fs == 1.0 and kernel in (Kernel.LINEAR, Kernel.CUBIC, Kernel.CUBIC_CV):
        return 2 if kernel == Kernel.LINEAR else 4
    # Pillow's tap range [floor(u - support + 0.5), floor(u + support + 0.5)): at most ceil(2 * support).
    return math.ceil(2.0 * kernel_radius(kernel) * fs)


def _phase_taps(phase: np.ndarray, kernel: Kernel, scale: float, antialias: bool):
    """First tap and weights ``[..., T]`` of the positions ``k + phase``, the same for every ``k``.

    The first tap is an offset from the pixel containing the position; ``phase`` is in ``[0, 1)``.
    """
    fs = _filter_width(kernel, scale, antialias)
    count = _tap_count(kernel, scale, antialias)
    t = np.arange(count)
    if kernel == Kernel.AREA:
        lo, hi = phase - scale / 2.0, phase + scale / 2.0
        off = np.floor(lo)
        j = off[..., None] + t
        w = np.clip(np.minimum(j + 1.0, hi[..., None]) - np.maximum(j, lo[..., None]), 0.0, None)
        return off.astype(np.int64), _normalised(w)
    if fs == 1.0 and kernel in (Kernel.LINEAR, Kernel.CUBIC, Kernel.CUBIC_CV):
        # Plain interpolation: the classic weights, which sum to one by construction.
        base = np.floor(phase - 0.5)
        f = ((phase - 0.5) - base)[..., None]
        if kernel == Kernel.LINEAR:
            return base.astype(np.int64), np.concatenate([1.0 - f, f], axis=-1)
        a = -0.5 if kernel == Kernel.CUBIC else -0.75
        w0, w1, w2 = _cubic(f + 1.0, a), _cubic(f, a), _cubic(1.0 - f, a)
        return base.astype(np.int64) - 1, np.concatenate([w0, w1, w2, ((1.0 - w0) - w1) - w2], axis=-1)
    support = kernel_radius(kernel) * fs
    off = np.floor(phase - support + 0.5)
    end = np.floor(phase + support + 0.5)
    d = (off[..., None] + t + 0.5 - phase[..., None]) * (1.0 / fs)
    if kernel == Kernel.LINEAR:
        w = np.clip(1.0 - np.abs(d), 0.0, None)
    elif kernel == Kernel.CUBIC:
        w = _cubic(d, -0.5)
    elif kernel == Kernel.CUBIC_CV:
        w = _cubic(d, -0.75)
    else:
        w = _lanczos4(d)
    w = np.where(off[..., None] + t < end[..., None], w, 0.0)
    return off.astype(np.int64), _normalised(w)


def _axis_taps(u: np.ndarray, kernel: Kernel, scale: float, antialias: bool, size: int, drop: bool):
    """First tap, double weights and fixed-point weights ``[..., T]`` of every position in ``u``.

    Positions are taken to 1/PHASES pixel; the weights are those of the position's phase (a table in
    the engine), renormalised over the taps inside the image (``drop``) where some fall outside,
    then rounded to WEIGHT_BITS fractional bits.
    """
    q = np.floor(u * PHASES + 0.5).astype(np.int64)
    off, w = _phase_taps((q & (PHASES - 1)) / PHASES, kernel, scale, antialias)
    j0 = (q >> 8) + off
    if drop:
        inside = (j0[..., None] + np.arange(w.shape[-1]) >= 0) & (j0[..., None] + np.arange(w.shape[-1]) < size)
        w = np.where(inside.all(-1, keepdims=True), w, _normalised(np.where(inside, w, 0.0)))
    return j0, np.floor(w * (1 << WEIGHT_BITS) + 0.5).astype(np.int64)


def _normalised(w: np.ndarray) -> np.ndarray:
    # Sequential sum and one reciprocal, the engine's arithmetic (so both round alike).
    total = w[..., 0].copy()
    for t in range(1, w.shape[-1]):
        total += w[..., t]
    return w * (1.0 / np.where(total == 0.0, 1.0, total))[..., None]


def _opencv_positions(m: Affine2, fx: np.ndarray, fy: np.ndarray, nearest: bool):
    """``m`` (Pillow coordinates) applied as cv::warpAffine applies its inverse matrix."""
    a00, a01, c0, a10, a11, c1 = m
    # The same map in OpenCV's centred coordinates: p_src - 0.5 = A (p - 0.5) + b.
    b0 = c0 + 0.5 * (a00 + a01) - 0.5
    b1 = c1 + 0.5 * (a10 + a11) - 0.5
    x, y = fx - 0.5, fy - 0.5
    # AB_BITS = 10 fractional bits; cvRound is round-half-even (np.rint); INTER_BITS = 5.
    delta = 512 if nearest else 16
    big_x = np.rint(a00 * x * 1024.0).astype(np.int64) + np.rint((a01 * y + b0) * 1024.0).astype(np.int64) + delta
    big_y = np.rint(a10 * x * 1024.0).astype(np.int64) + np.rint((a11 * y + b1) * 1024.0).astype(np.int64) + delta
    if nearest:
        return (big_x >> 10) + 0.5, (big_y >> 10) + 0.5
    return (big_x >> 5) / 32.0 + 0.5, (big_y >> 5) / 32.0 + 0.5


def uses_crop_frame(plan: WarpPlan) -> bool:
    """Whether ``plan`` is a RandomAffine(nearest) whose frame is exactly the plain crop path's output.

    True for a snapped plan over the crop's antialiased bilinear filter (``csrc/decode/warp_decode.h``'s
    ``warp_uses_crop_frame``): both backends then make the frame with their plain crop path (the crop
    resized by the geometry op, filters bounded by the crop as torchvision's crop-then-resize) and
    copy pixels with :func:`gather_frame`: torchvision's two-pass result.
    """
    a, b, _c, d, e, _f = plan.to_source
    if plan.frame is None:
        return False
    fx0, fy0, fx1, fy1 = plan.frame
    return (
        plan.snap
        and plan.kernel == Kernel.LINEAR
        and plan.antialias
        and not plan.quantize
        and fx0 == 0.0
        and fy0 == 0.0
        and 1.0 <= fx1 <= 16384.0
        and 1.0 <= fy1 <= 16384.0
        and float(fx1).is_integer()
        and float(fy1).is_integer()
        and b == 0.0
        and d == 0.0
        and a != 0.0
        and e > 0.0
    )


def gather_frame(frame: np.ndarray, plan: WarpPlan) -> np.ndarray:
    """Each output pixel copies the ``frame`` pixel its frame point falls in, or gets ``fill``.

    ``frame`` is the ``[H, W, 3]`` image the plan's frame rectangle ``(0, 0, W, H)`` describes (the
    resized crop); the arithmetic is the engine's ``warp_gather`` (IEEE doubles, the same order).
    """
    h, w = frame.shape[:2]
    a, b, c, d, e, f = plan.to_frame
    py = np.arange(plan.out_h, dtype=np.float64)[:, None] + 0.5
    px = np.arange(plan.out_w, dtype=np.float64)[None, :] + 0.5
    fx = a * px + (b * py + c)
    fy = d * px + (e * py + f)
    inside = (fx >= 0.0) & (fx < w) & (fy >= 0.0) & (fy < h)
    if plan.frame is not None:
        x0, y0, x1, y1 = plan.frame
        inside &= (fx >= x0) & (fx < x1) & (fy >= y0) & (fy < y1)
    out = np.empty((plan.out_h, plan.out_w, 3), np.uint8)
    out[...] = plan.fill
    out[inside] = frame[fy[inside].astype(np.intp), fx[inside].astype(np.intp)]
    return out


def warp_image(src: np.ndarray, plan: WarpPlan) -> np.ndarray:
    """Evaluates ``plan`` on a full-resolution RGB image.

    Args:
        src: uint8 ``[H, W, 3]``, the decoded source.
        plan: The sample's :class:`WarpPlan`.

    Returns:
        uint8 ``[out_h, out_w, 3]``.
    """
    src = np.asarray(src)
    if src.ndim != 3 or src.shape[2] != 3 or src.dtype != np.uint8:
        raise ValueError(f"src must be uint8 [H, W, 3], got {src.dtype} {src.shape}")
    ys, xs = np.meshgrid(np.arange(plan.out_h) + 0.5, np.arange(plan.out_w) + 0.5, indexing="ij")
    fx, fy = apply_point(plan.to_frame, xs, ys)
    inside = np.ones(xs.shape, bool)
    if plan.frame is not None:
        x0, y0, x1, y1 = plan.frame
        inside = (fx >= x0) & (fx < x1) & (fy >= y0) & (fy < y1)
    if plan.snap:
        fx, fy = np.floor(fx) + 0.5, np.floor(fy) + 0.5
    if plan.quantize:
        u, v = _opencv_positions(plan.to_source, fx, fy, plan.kernel == Kernel.NEAREST)
    else:
        u, v = apply_point(plan.to_source, fx, fy)
    fill = np.asarray(plan.fill, np.float64)
    if plan.kernel == Kernel.NEAREST:
        out = _nearest(src, u, v, plan)
    elif plan.kernel == Kernel.LINEAR and _filter_scale(plan, 0) == 1.0 and _filter_scale(plan, 1) == 1.0:
        out = _bilinear_fixed(src, u, v, plan)
    else:
        out = _generic(src, u, v, plan)
    return np.where(inside[..., None], out, fill).astype(np.uint8)


def _filter_scale(plan: WarpPlan, axis: int) -> float:
    return max(1.0, plan.scale[axis]) if plan.antialias else 1.0


def _nearest(src: np.ndarray, u: np.ndarray, v: np.ndarray, plan: WarpPlan) -> np.ndarray:
    height, width = src.shape[:2]
    jx = np.floor(u + plan.nearest_shift[0] + NEAREST_EPSILON).astype(np.int64)
    jy = np.floor(v + plan.nearest_shift[1] + NEAREST_EPSILON).astype(np.int64)
    out = src[np.clip(jy, 0, height - 1), np.clip(jx, 0, width - 1)].astype(np.float64)
    if plan.border == Border.CONSTANT:
        outside = (jx < 0) | (jx >= width) | (jy < 0) | (jy >= height)
        out = np.where(outside[..., None], np.asarray(plan.fill, np.float64), out)
    return out


def _bilinear_fixed(src: np.ndarray, u: np.ndarray, v: np.ndarray, plan: WarpPlan) -> np.ndarray:
    """Plain bilinear interpolation in integers: positions to 1/256 pixel, 8-bit weights.

    Exact in any implementation, and OpenCV's own result for its 1/32-pixel warp positions.
    Taps outside the source read ``fill`` (CONSTANT) or the edge pixel (REPLICATE, and DROP, which
    for two taps comes to the same).
    """
    height, width = src.shape[:2]
    qx = np.floor((u - 0.5) * 256.0 + 0.5).astype(np.int64)
    qy = np.floor((v - 0.5) * 256.0 + 0.5).astype(np.int64)
    x0, fx = qx >> 8, (qx & 255)[..., None]
    y0, fy = qy >> 8, (qy & 255)[..., None]
    fill = np.asarray(plan.fill, np.int64)

    def tap(jy, jx):
        value = src[np.clip(jy, 0, height - 1), np.clip(jx, 0, width - 1)].astype(np.int64)
        if plan.border == Border.CONSTANT:
            outside = (jx < 0) | (jx >= width) | (jy < 0) | (jy >= height)
            value = np.where(outside[..., None], fill, value)
        return value

    top = (256 - fx) * tap(y0, x0) + fx * tap(y0, x0 + 1)
    bottom = (256 - fx) * tap(y0 + 1, x0) + fx * tap(y0 + 1, x0 + 1)
    return ((256 - fy) * top + fy * bottom + 32768) >> 16


def _generic(src: np.ndarray, u: np.ndarray, v: np.ndarray, plan: WarpPlan) -> np.ndarray:
    """The tabulated kernels: integer taps, int64 accumulation, rounded half up."""
    height, width = src.shape[:2]
    drop = plan.border == Border.DROP
    jx, wx = _axis_taps(u, plan.kernel, plan.scale[0], plan.antialias, width, drop)
    jy, wy = _axis_taps(v, plan.kernel, plan.scale[1], plan.antialias, height, drop)
    fill = np.asarray(plan.fill, np.int64)
    img = src.astype(np.int64)
    col_idx = jx[..., None] + np.arange(wx.shape[-1])
    row_idx = jy[..., None] + np.arange(wy.shape[-1])
    col_in = (col_idx >= 0) & (col_idx < width)
    row_in = (row_idx >= 0) & (row_idx < height)
    cols = np.clip(col_idx, 0, width - 1)
    rows = np.clip(row_idx, 0, height - 1)
    acc = np.zeros((*u.shape, 3), np.int64)
    for ty in range(wy.shape[-1]):
        row_sum = np.zeros((*u.shape, 3), np.int64)
        for tx in range(wx.shape[-1]):
            value = img[rows[..., ty], cols[..., tx]]
            if plan.border == Border.CONSTANT:
                value = np.where((row_in[..., ty] & col_in[..., tx])[..., None], value, fill)
            row_sum += wx[..., tx, None] * value
        acc += wy[..., ty, None] * row_sum
    return np.clip((acc + (1 << (2 * WEIGHT_BITS - 1))) >> (2 * WEIGHT_BITS), 0, 255)
