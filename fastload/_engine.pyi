# Type stub of fastload._engine, the C++ decode engine (csrc/bindings.cpp). Its enums (enum.IntEnum
# classes, pybind11's native_enum) and parameter structs are generated from fastload/engine_abi.py;
# tests/test_engine_abi.py checks this stub against the built module with mypy's stubtest, so a
# binding added without its stub fails the tests.
import enum
from typing import Any, ClassVar, Dict, List, Optional, Sequence, Tuple, type_check_only

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
    antialias: bool
    pad_left: int
    pad_top: int
    pad_right: int
    pad_bottom: int
    pad_if_needed: bool
    padding_mode: PaddingMode
    fill: List[float]
    def __init__(self) -> None: ...

class OutputParams(metaclass=_PybindType):
    dtype: DType
    layout: Layout
    normalize: bool
    scale: float
    mean: List[float]
    std_dev: List[float]
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
) -> Dict[str, Any]: ...
def decode_image(buf: Buffer, options: DecodeSettings) -> Tuple[Status, str, Optional[npt.NDArray[np.uint8]]]: ...
def resize_encode_batch(
    images: Sequence[Buffer], shorter: int, quality: int, threads: int, options: DecodeSettings
) -> List[Tuple[Status, str, Optional[bytes]]]: ...
def frame_files(
    paths: Sequence[bytes], sizes: Sequence[int], heads: Sequence[Buffer], out: Buffer
) -> Tuple[npt.NDArray[np.int64], int]: ...
def set_threads(threads: int) -> None: ...
def get_threads() -> int: ...
def info() -> Dict[str, Any]: ...
def _pool_hold_creation_lock(milliseconds: int) -> None: ...
def _force_hwc_scratch(on: bool) -> None: ...
def _resize_force_kernels(name: str) -> bool: ...
def add_restart_markers(buf: Buffer, max_mcus: int = 4, verify: bool = False) -> Tuple[bytes, Dict[str, Any]]: ...
def restart_geometry(buf: Buffer) -> Optional[Dict[str, int]]: ...
def restart_slice(buf: Buffer, x: int, y: int, w: int, h: int, scale_denom: int = 1) -> Tuple[bytes, int, int]: ...
def restart_verify(a: Buffer, b: Buffer) -> bool: ...
def _restart_force_scalar_scan(scalar: bool) -> None: ...
