# Type stub of fastload._engine, the C++ decode engine (csrc/bindings.cpp). Its enums (enum.IntEnum
# classes, pybind11's native_enum) and parameter structs are generated from fastload/engine_abi.py;
# tests/test_engine_abi.py checks this stub against the built module with mypy's stubtest, so a
# binding added without its stub fails the tests.
import enum
from collections.abc import Sequence
from typing import Any, ClassVar, type_check_only

import numpy as np
import numpy.typing as npt
from typing_extensions import Buffer

@type_check_only
class _PybindType(type):
    """pybind11's metaclass of bound classes (pybind11_builtins.pybind11_type)."""

class Status(enum.IntEnum):
    __pybind11_native_enum__: ClassVar[object]  # pybind11's capsule
    OK = 0
    NEEDS_PILLOW = 1
    EMPTY = 2
    TRUNCATED = 3
    CORRUPT = 4
    UNSUPPORTED = 5
    TOO_LARGE = 6
    INTERNAL = 7
    TOO_SMALL = 8

class Layout(enum.IntEnum):
    __pybind11_native_enum__: ClassVar[object]  # pybind11's capsule
    NHWC = 0
    NCHW = 1

class GeometryKind(enum.IntEnum):
    __pybind11_native_enum__: ClassVar[object]  # pybind11's capsule
    RANDOM_RESIZED_CROP = 0
    RESIZE_CENTER_CROP = 1
    RESIZE = 2
    RANDOM_CROP = 3
    MXNET_AUGMENT = 4

class Interpolation(enum.IntEnum):
    __pybind11_native_enum__: ClassVar[object]  # pybind11's capsule
    BILINEAR = 0
    BICUBIC = 1
    NEAREST = 2

class PaddingMode(enum.IntEnum):
    __pybind11_native_enum__: ClassVar[object]  # pybind11's capsule
    CONSTANT = 0
    EDGE = 1
    REFLECT = 2
    SYMMETRIC = 3

class DType(enum.IntEnum):
    __pybind11_native_enum__: ClassVar[object]  # pybind11's capsule
    UINT8 = 0
    FLOAT32 = 1
    FLOAT16 = 2

class EntropyDecoder(enum.IntEnum):
    __pybind11_native_enum__: ClassVar[object]  # pybind11's capsule
    FASTLOAD = 0
    LIBJPEG = 1

class PixelPrim(enum.IntEnum):
    __pybind11_native_enum__: ClassVar[object]  # pybind11's capsule
    IDENTITY = 0
    SHEAR_X = 1
    SHEAR_Y = 2
    TRANSLATE_X = 3
    TRANSLATE_Y = 4
    ROTATE = 5
    BRIGHTNESS = 6
    COLOR = 7
    CONTRAST = 8
    SHARPNESS = 9
    POSTERIZE = 10
    SOLARIZE = 11
    AUTOCONTRAST = 12
    EQUALIZE = 13
    INVERT = 14
    HUE = 15
    GRAYSCALE = 16

class PixelOpKind(enum.IntEnum):
    __pybind11_native_enum__: ClassVar[object]  # pybind11's capsule
    COLOR_JITTER = 0
    RANDOM_GRAYSCALE = 1
    LIGHTING = 2
    MXNET_COLOR = 3
    AUTO_AUGMENT = 4
    RAND_AUGMENT = 5
    TRIVIAL_AUGMENT_WIDE = 6
    TIMM_RAND_AUGMENT = 7
    TIMM_AUTO_AUGMENT = 8
    TIMM_AUGMIX = 9

class TimmOpName(enum.IntEnum):
    __pybind11_native_enum__: ClassVar[object]  # pybind11's capsule
    AUTO_CONTRAST = 0
    EQUALIZE = 1
    INVERT = 2
    ROTATE = 3
    POSTERIZE = 4
    POSTERIZE_INCREASING = 5
    POSTERIZE_ORIGINAL = 6
    SOLARIZE = 7
    SOLARIZE_INCREASING = 8
    SOLARIZE_ADD = 9
    COLOR = 10
    COLOR_INCREASING = 11
    CONTRAST = 12
    CONTRAST_INCREASING = 13
    BRIGHTNESS = 14
    BRIGHTNESS_INCREASING = 15
    SHARPNESS = 16
    SHARPNESS_INCREASING = 17
    SHEAR_X = 18
    SHEAR_Y = 19
    TRANSLATE_X = 20
    TRANSLATE_Y = 21
    TRANSLATE_X_REL = 22
    TRANSLATE_Y_REL = 23

class WarpMode(enum.IntEnum):
    __pybind11_native_enum__: ClassVar[object]  # pybind11's capsule
    AFFINE = 0
    IDENTITY = 1
    ROTATE_90 = 2
    ROTATE_180 = 3
    ROTATE_270 = 4

class DecodeSettings(metaclass=_PybindType):
    max_pixels: int
    fast_idct: bool
    fancy_upsampling: bool
    apply_exif: bool
    use_restart_slices: bool
    dct_scaling: bool
    slice_entropy: EntropyDecoder
    def __init__(self) -> None: ...

class GeometryParams(metaclass=_PybindType):
    kind: GeometryKind
    out_h: int
    out_w: int
    scale_lo: float
    scale_hi: float
    ratio_lo: float
    ratio_hi: float
    flip: float
    vflip: float
    resize: int
    interpolation: Interpolation
    random_interpolation: bool
    interpolation2: Interpolation
    antialias: bool
    pad_left: int
    pad_top: int
    pad_right: int
    pad_bottom: int
    pad_if_needed: bool
    padding_mode: PaddingMode
    fill: list[float]
    def __init__(self) -> None: ...

class OutputParams(metaclass=_PybindType):
    dtype: DType
    layout: Layout
    normalize: bool
    scale: float
    mean: list[float]
    std_dev: list[float]
    def __init__(self) -> None: ...

def decode_batch(
    images: Sequence[Buffer],
    out: Buffer,
    geometry: GeometryParams,
    output: OutputParams,
    ops: Sequence[Any],
    erase: Any,
    seed: int,
    epoch: int,
    indices: npt.ArrayLike,
    threads: int,
    options: DecodeSettings,
    want_params: bool = False,
    warp: Any = None,
    mix: tuple[bool, float, tuple[int, int, int, int], float] | None = None,
) -> dict[str, Any]: ...
def decode_image(buf: Buffer, options: DecodeSettings) -> tuple[Status, str, npt.NDArray[np.uint8] | None]: ...
def resize_encode_batch(
    images: Sequence[Buffer], shorter: int, quality: int, threads: int, options: DecodeSettings
) -> list[tuple[Status, str, bytes | None]]: ...
def gather_rows(
    fds: npt.NDArray[np.int32], offsets: npt.NDArray[np.int64], row_bytes: int, out: Buffer
) -> tuple[int, int]: ...
def frame_files(
    paths: Sequence[bytes], sizes: Sequence[int], heads: Sequence[Buffer], out: Buffer
) -> tuple[npt.NDArray[np.int64], int]: ...
def set_threads(threads: int) -> None: ...
def get_threads() -> int: ...
def info() -> dict[str, Any]: ...
def _pool_hold_creation_lock(milliseconds: int) -> None: ...
def _force_hwc_scratch(on: bool) -> None: ...
def _resize_force_kernels(name: str) -> bool: ...
def add_restart_markers(buf: Buffer, max_mcus: int = 4, verify: bool = False) -> tuple[bytes, dict[str, Any]]: ...
def restart_geometry(buf: Buffer) -> dict[str, int] | None: ...
def restart_slice(buf: Buffer, x: int, y: int, w: int, h: int, scale_denom: int = 1) -> tuple[bytes, int, int]: ...
def restart_verify(a: Buffer, b: Buffer) -> bool: ...
def _restart_force_scalar_scan(scalar: bool) -> None: ...
def pixel_prim(
    image: npt.NDArray[np.uint8],
    prim: int,
    magnitude: float,
    warp: Sequence[float],
    bilinear: bool,
    fill: Sequence[int],
) -> None: ...
def pixel_mx_prim(image: npt.NDArray[np.uint8], name: str, args: Sequence[float]) -> None: ...
def pixel_ops_batch(
    images: npt.NDArray[np.uint8],
    ops: Sequence[dict[str, Any]],
    seed: int,
    epoch: int,
    indices: npt.ArrayLike,
    threads: int,
    want_trace: bool,
) -> npt.NDArray[np.float64] | None: ...
def erasing_batch(
    images: npt.NDArray[Any],
    channels_first: bool,
    spec: dict[str, Any],
    seed: int,
    epoch: int,
    indices: npt.ArrayLike,
    threads: int,
    want_trace: bool,
) -> npt.NDArray[np.float64] | None: ...
def mix_batch(
    images: npt.NDArray[Any],
    labels: npt.ArrayLike,
    soft: npt.NDArray[np.float32],
    cutmix: bool,
    lam: float,
    box: Sequence[int],
    lam_labels: float,
    channels_first: bool,
    threads: int,
) -> None: ...
def pixel_kernels(name: str) -> bool: ...
def pixel_kernel_name() -> str: ...
def _warp_affine_plan(
    spec: Any,
    box: tuple[float, ...],
    flip: bool,
    out_h: int,
    out_w: int,
    key: int,
    crop_interpolation: str = "bilinear",
    crop_antialias: bool = True,
) -> tuple[dict[str, Any], tuple[float, ...]]: ...
def _warp_mxnet_plan(spec: Any, width: int, height: int, key: int) -> tuple[dict[str, Any], tuple[float, ...]]: ...
def _warp_image(src: npt.NDArray[np.uint8], plan: Any) -> npt.NDArray[np.uint8]: ...
def _warp_source_rect(plan: Any, denom: int, scaled_w: int, scaled_h: int) -> tuple[int, int, int, int]: ...
def _warp_decode(
    buf: Buffer, plan: Any, options: DecodeSettings
) -> tuple[int, str, npt.NDArray[np.uint8] | None, int]: ...
