"""Pixels stage, native boundary: the one definition of what crosses between Python and the C++ engine.

Every enum and parameter struct that ``fastload._engine`` takes or returns is defined here, once:

* Python uses these enums directly (``fastload.decode.DecodeStatus`` is :class:`Status`,
  ``fastload.transforms.OpKind`` is :class:`GeometryKind`), so the Pillow path needs no extension.
* ``setup.py`` generates the C++ declarations from this file when it builds the engine (the header
  ``fastload_abi.h`` in the build directory): ``enum class`` types with the same values, plain structs
  with the same fields and defaults, and X-macro lists that ``csrc/bindings.cpp`` expands into
  ``py::enum_`` / ``py::class_`` bindings. Nothing is copied by hand; ``tests/test_engine_abi.py``
  checks the built engine against these tables, and ``fastload/_engine.pyi`` against the engine.

The file is read by ``setup.py`` without importing ``fastload`` (plain data, standard library only).
To add a value or a field: add it here, rebuild (``setup.py build_ext --inplace``), update the stub.
"""

from __future__ import annotations

import enum

__all__ = [
    "ENUMS",
    "STRUCTS",
    "DType",
    "EntropyDecoder",
    "Field",
    "GeometryKind",
    "Interpolation",
    "Layout",
    "PaddingMode",
    "PixelOpKind",
    "PixelPrim",
    "Status",
    "TimmOpName",
    "WarpMode",
]


class Status(enum.IntEnum):
    """Per-image outcome of a decode (``BatchResult.status``)."""

    OK = 0
    #: Internal: the engine left this image to the Pillow path (not a JPEG, or EXIF orientation to apply).
    NEEDS_PILLOW = 1
    EMPTY = 2
    TRUNCATED = 3
    CORRUPT = 4
    UNSUPPORTED = 5
    TOO_LARGE = 6
    INTERNAL = 7
    #: The image is smaller than an unscaled crop (RandomCrop without enough padding).
    TOO_SMALL = 8


class Layout(enum.IntEnum):
    """Memory layout of an output batch."""

    NHWC = 0
    NCHW = 1


class GeometryKind(enum.IntEnum):
    """The geometric op that maps a decoded image to the output size."""

    RANDOM_RESIZED_CROP = 0
    RESIZE_CENTER_CROP = 1
    RESIZE = 2
    RANDOM_CROP = 3
    #: MXNet's default augmenter (resize, affine warp, pad, crop, mirror) as one warp
    #: (``fastload.transforms.mxnet_augment``); its parameters travel beside the GeometryParams.
    MXNET_AUGMENT = 4


class Interpolation(enum.IntEnum):
    """Resampling filter of the geometry ops."""

    BILINEAR = 0
    BICUBIC = 1
    NEAREST = 2


class PaddingMode(enum.IntEnum):
    """How RandomCrop fills its padding (torchvision's ``padding_mode``)."""

    CONSTANT = 0
    EDGE = 1
    REFLECT = 2
    SYMMETRIC = 3


class DType(enum.IntEnum):
    """Element type of an output batch."""

    UINT8 = 0
    FLOAT32 = 1
    FLOAT16 = 2


class EntropyDecoder(enum.IntEnum):
    """Which Huffman decoder restart-interval slices use."""

    #: fastload's interval decoder (csrc/entropy_decode.h); libjpeg's where the build lacks it.
    FASTLOAD = 0
    #: libjpeg's own decoder (slices keep their RST markers; same pixels, slower).
    LIBJPEG = 1


class PixelPrim(enum.IntEnum):
    """Single-image primitives of the pixel ops (torchvision's op names, its PIL backend's arithmetic)."""

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
    """The pixel op specs of fastload.transforms that the engine runs on the output-sized image."""

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
    """The ops of timm's augmentation policies (``timm.data.auto_augment``'s names), each with its level function."""

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
    """How a geometric pixel primitive maps pixels: Pillow's affine transform or one of its exact transposes."""

    AFFINE = 0
    IDENTITY = 1
    ROTATE_90 = 2  # Pillow's Transpose.ROTATE_90 (counter-clockwise)
    ROTATE_180 = 3
    ROTATE_270 = 4


#: Enum name -> class, in the order the C++ header declares them.
ENUMS: dict[str, type[enum.IntEnum]] = {
    "Status": Status,
    "Layout": Layout,
    "GeometryKind": GeometryKind,
    "Interpolation": Interpolation,
    "PaddingMode": PaddingMode,
    "DType": DType,
    "EntropyDecoder": EntropyDecoder,
    "PixelPrim": PixelPrim,
    "PixelOpKind": PixelOpKind,
    "TimmOpName": TimmOpName,
    "WarpMode": WarpMode,
}

#: One struct field: (type, name, default, doc). Types: ``bool``, ``int``, ``int64``, ``double``,
#: ``double3`` (three doubles), or an enum name from :data:`ENUMS` (default: a member name).
Field = tuple[str, str, object, str]

#: Struct name -> fields, in declaration order.
STRUCTS: dict[str, tuple[Field, ...]] = {
    "DecodeSettings": (
        ("int64", "max_pixels", 89_478_485, "largest width * height accepted (decompression-bomb guard)"),
        ("bool", "fast_idct", False, "libjpeg's fast integer IDCT (JDCT_IFAST)"),
        ("bool", "fancy_upsampling", True, "smooth (triangle) chroma upsampling"),
        ("bool", "apply_exif", False, "rotate/mirror by the EXIF orientation (via the Pillow path)"),
        ("bool", "use_restart_slices", True, "decode restart-indexed records through interval slices"),
        ("bool", "dct_scaling", True, "power-of-two DCT-domain downscaling when the crop is >= 2x the output"),
        ("EntropyDecoder", "slice_entropy", "FASTLOAD", "Huffman decoder of restart-interval slices"),
    ),
    "GeometryParams": (
        ("GeometryKind", "kind", "RESIZE", "which geometric op"),
        ("int", "out_h", 0, "output height"),
        ("int", "out_w", 0, "output width"),
        ("double", "scale_lo", 0.08, "RandomResizedCrop: smallest area fraction"),
        ("double", "scale_hi", 1.0, "RandomResizedCrop: largest area fraction"),
        ("double", "ratio_lo", 0.75, "RandomResizedCrop: smallest aspect ratio (w / h)"),
        ("double", "ratio_hi", 4.0 / 3.0, "RandomResizedCrop: largest aspect ratio (w / h)"),
        ("double", "flip", 0.0, "probability of a horizontal flip"),
        ("double", "vflip", 0.0, "probability of a vertical flip"),
        ("int", "resize", 0, "CenterCrop: shorter side before the crop (0: the largest centred box)"),
        ("Interpolation", "interpolation", "BILINEAR", "resampling filter"),
        ("bool", "random_interpolation", False, "per image: interpolation (draw 42 < 0.5) or interpolation2"),
        ("Interpolation", "interpolation2", "BICUBIC", "the second filter of a per-image choice"),
        ("bool", "antialias", True, "support-scaled filters when downscaling (PIL / torchvision antialias=True)"),
        ("int", "pad_left", 0, "RandomCrop: padding on the left"),
        ("int", "pad_top", 0, "RandomCrop: padding on top"),
        ("int", "pad_right", 0, "RandomCrop: padding on the right"),
        ("int", "pad_bottom", 0, "RandomCrop: padding at the bottom"),
        ("bool", "pad_if_needed", False, "RandomCrop: pad images smaller than the crop"),
        ("PaddingMode", "padding_mode", "CONSTANT", "RandomCrop: how padding is filled"),
        ("double3", "fill", (0.0, 0.0, 0.0), "RandomCrop: constant padding value per channel (0..255)"),
    ),
    "OutputParams": (
        ("DType", "dtype", "UINT8", "element type of the output batch"),
        ("Layout", "layout", "NHWC", "memory layout of the output batch"),
        ("bool", "normalize", False, "write (pixel * scale - mean) / std_dev instead of the pixel"),
        ("double", "scale", 1.0, "Normalize: factor applied to the 0..255 pixel first"),
        ("double3", "mean", (0.0, 0.0, 0.0), "Normalize: per-channel mean (after scale)"),
        ("double3", "std_dev", (1.0, 1.0, 1.0), "Normalize: per-channel standard deviation (after scale)"),
    ),
}
