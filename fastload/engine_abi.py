"""Pixels stage, native boundary: the one definition of what crosses between Python and the C++ engine.

Every enum, parameter struct and function of ``fastload._engine`` is defined here, once:

* Python uses these enums directly (``fastload.decode.DecodeStatus`` is :class:`Status`,
  ``fastload.transforms.OpKind`` is :class:`GeometryKind`), so the Pillow path needs no extension.
* ``setup.py`` generates the C++ declarations from this file when it builds the engine (the header
  ``fastload_abi.h`` in the build directory): ``enum class`` types with the same values, plain structs
  with the same fields and defaults, each function's ``py::arg`` list and docstring, and X-macro
  lists that the glue (``csrc/glue/``) expands into ``py::native_enum`` / ``py::class_`` bindings.
* ``setup.py abi_stub`` generates the type stub ``fastload/_engine.pyi`` from the same tables
  (``--check`` fails when the committed stub differs); mypy's stubtest checks the stub against the
  built engine.
* Python hands the engine typed structs only, built from plain values field by field from these
  tables by :func:`fastload.engine_structs.to_native` (a misspelt field is an error, a wrong type a
  ``TypeError`` at the boundary). The engine never reads a Python object by attribute name or
  parses a dict.

The file is read by ``setup.py`` without importing ``fastload`` (plain data, standard library only).
To add a value, a field or a function: add it here, rebuild (``setup.py build_ext --inplace``),
regenerate the stub (``setup.py abi_stub``).
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

__all__ = [
    "ENUMS",
    "FUNCTIONS",
    "STRUCTS",
    "STRUCT_DOCS",
    "DType",
    "EntropyDecoder",
    "Field",
    "Function",
    "GeometryKind",
    "Interpolation",
    "Layout",
    "MXNetColorStep",
    "PaddingMode",
    "Param",
    "PixelOpKind",
    "PixelPrim",
    "Status",
    "TimmOpName",
    "WarpBorder",
    "WarpKernel",
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

    #: fastload's interval decoder (csrc/decode/entropy_decode.h); libjpeg's where the build lacks it.
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


class WarpKernel(enum.IntEnum):
    """Interpolation kernel of a warp plan (``fastload.transforms.warp.Kernel``)."""

    NEAREST = 0
    LINEAR = 1
    CUBIC = 2
    CUBIC_CV = 3
    LANCZOS4 = 4
    AREA = 5


class WarpBorder(enum.IntEnum):
    """What a warp plan's taps outside the source read (``fastload.transforms.warp.Border``)."""

    DROP = 0
    REPLICATE = 1
    CONSTANT = 2


class MXNetColorStep(enum.IntEnum):
    """One step of MXNet's colour augmenter, run alone by a testing hook of the engine."""

    BRIGHTNESS = 0
    CONTRAST = 1
    SATURATION = 2
    HLS = 3
    PCA = 4


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
    "WarpKernel": WarpKernel,
    "WarpBorder": WarpBorder,
    "MXNetColorStep": MXNetColorStep,
}

#: One struct field: (type, name, default, doc). Types: ``bool``, ``int``, ``int64``, ``uint64``,
#: ``float`` (float32), ``double``; an enum name from :data:`ENUMS` (default: a member name); a struct
#: name declared earlier in :data:`STRUCTS` (default: None, the struct's own defaults);
#: ``T[N]`` (N values of the scalar T, ``uint8`` included; default: a tuple); ``list[T]`` (any
#: number of T, a scalar, a struct or a list; default: ``()``).
Field = tuple[str, str, Any, str]

_IDENTITY_WARP = (1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)

#: Struct name -> fields, in declaration order (a struct is declared after the structs it holds).
STRUCTS: dict[str, tuple[Field, ...]] = {
    # ---- decode ------------------------------------------------------------------------------
    "DecodeSettings": (
        ("int64", "max_pixels", 89_478_485, "largest width * height accepted (decompression-bomb guard)"),
        ("bool", "fast_idct", False, "libjpeg's fast integer IDCT (JDCT_IFAST)"),
        ("bool", "fancy_upsampling", True, "smooth (triangle) chroma upsampling"),
        ("bool", "apply_exif", False, "rotate/mirror by the EXIF orientation (via the Pillow path)"),
        ("bool", "use_restart_slices", True, "decode restart-indexed records through interval slices"),
        ("bool", "dct_scaling", True, "power-of-two DCT downscaling where the resize still shrinks >= 4-5x after it"),
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
        ("double[3]", "fill", (0.0, 0.0, 0.0), "RandomCrop: constant padding value per channel (0..255)"),
    ),
    "OutputParams": (
        ("DType", "dtype", "UINT8", "element type of the output batch"),
        ("Layout", "layout", "NHWC", "memory layout of the output batch"),
        ("bool", "normalize", False, "write (pixel * scale - mean) / std_dev instead of the pixel"),
        ("double", "scale", 1.0, "Normalize: factor applied to the 0..255 pixel first"),
        ("double[3]", "mean", (0.0, 0.0, 0.0), "Normalize: per-channel mean (after scale)"),
        ("double[3]", "std_dev", (1.0, 1.0, 1.0), "Normalize: per-channel standard deviation (after scale)"),
    ),
    # ---- pixel ops (fastload.transforms.color / policy / mxnet_color) -------------------------
    "PolicyStep": (
        ("PixelPrim", "prim", "IDENTITY", "the primitive"),
        ("double", "prob", 0.0, "applied when the step's draw is <= prob"),
        ("double", "magnitude", 0.0, "the step's fixed magnitude"),
        ("bool", "is_signed", False, "the magnitude gets a random sign"),
        (
            "double[14]",
            "warps",
            _IDENTITY_WARP * 2,
            "geometric primitives: Pillow's warp of +magnitude, then of -magnitude (WarpMode, a0..a5 each)",
        ),
    ),
    "PolicyOp": (
        ("PixelPrim", "prim", "IDENTITY", "the primitive"),
        ("bool", "is_signed", False, "the magnitude gets a random sign"),
        ("list[double]", "magnitudes", (), "the magnitude bins (empty for magnitude-free primitives)"),
        ("list[double]", "warps", (), "geometric primitives: per bin, the warps of +m and -m (14 numbers)"),
    ),
    "TimmOp": (
        ("TimmOpName", "name", "AUTO_CONTRAST", "which op (its level function and primitive)"),
        ("double", "prob", 1.0, "applied when the op's draw is <= prob"),
        ("double", "magnitude", 0.0, "the op's magnitude (level)"),
    ),
    "TimmPolicy": (
        (
            "list[TimmOp]",
            "ops",
            (),
            "RandAugment / AugMix: the candidate ops; AutoAugment: every sub-policy's steps, in order",
        ),
        ("list[int]", "groups", (), "AutoAugment: first step of each sub-policy, then the number of steps"),
        ("list[double]", "weights", (), "RandAugment: choice weights (picked without replacement); empty: uniform"),
        ("int", "num_layers", 2, "RandAugment: ops per image (0..12)"),
        ("double", "magnitude_std", 0.0, "> 0: magnitude ~ N(magnitude, std); inf: U(0, magnitude)"),
        ("double", "upper_bound", 10.0, "magnitudes are clipped to [0, upper_bound]"),
        ("double", "translate_const", 250.0, "TranslateX / TranslateY: pixels at level 10"),
        ("double", "translate_pct", 0.45, "TranslateXRel / TranslateYRel: fraction of the size at level 10"),
        ("int", "resample", -1, "PIL filter code of the geometric ops (0, 2, 3); -1: bilinear or bicubic per op"),
        ("double", "alpha", 1.0, "AugMix: Dirichlet / Beta concentration"),
        ("int", "width", 3, "AugMix: chains (1..16)"),
        ("int", "depth", -1, "AugMix: ops per chain (1..16; -1: 1..3 drawn)"),
    ),
    "PixelOp": (
        ("PixelOpKind", "kind", "COLOR_JITTER", "which op"),
        ("bool", "has_brightness", False, "ColorJitter: brightness is jittered"),
        ("bool", "has_contrast", False, "ColorJitter: contrast is jittered"),
        ("bool", "has_saturation", False, "ColorJitter: saturation is jittered"),
        ("bool", "has_hue", False, "ColorJitter: hue is jittered"),
        ("double[2]", "brightness", (1.0, 1.0), "ColorJitter: brightness factor range"),
        ("double[2]", "contrast", (1.0, 1.0), "ColorJitter: contrast factor range"),
        ("double[2]", "saturation", (1.0, 1.0), "ColorJitter: saturation factor range"),
        ("double[2]", "hue", (0.0, 0.0), "ColorJitter: hue shift range"),
        ("double", "p", 0.0, "RandomGrayscale: probability (Grayscale: 1)"),
        ("double", "alphastd", 0.0, "Lighting: standard deviation of the component weights"),
        ("double[3]", "eigval", (0.0, 0.0, 0.0), "Lighting: eigenvalues ([0, 1] pixel units)"),
        ("double[9]", "eigvec", (0.0,) * 9, "Lighting: eigenvectors, row-major [channel][component]"),
        ("double", "mx_brightness", 0.0, "MXNetColorAugment: brightness"),
        ("double", "mx_contrast", 0.0, "MXNetColorAugment: contrast"),
        ("double", "mx_saturation", 0.0, "MXNetColorAugment: saturation"),
        ("double", "mx_pca_noise", 0.0, "MXNetColorAugment: pca_noise"),
        ("int", "random_h", 0, "MXNetColorAugment: hue jitter"),
        ("int", "random_s", 0, "MXNetColorAugment: saturation jitter"),
        ("int", "random_l", 0, "MXNetColorAugment: lightness jitter"),
        ("list[PolicyOp]", "candidates", (), "RandAugment / TrivialAugmentWide: the candidate ops"),
        ("list[list[PolicyStep]]", "subpolicies", (), "AutoAugment: the sub-policies"),
        ("int", "num_ops", 2, "RandAugment: ops per image (1..31)"),
        ("int", "magnitude", 9, "RandAugment: the magnitude bin"),
        ("bool", "bilinear", False, "policies' geometric ops: bilinear, else nearest"),
        ("uint8[3]", "fill", (0, 0, 0), "policies' geometric ops: fill of the uncovered area"),
        ("TimmPolicy", "timm", None, "timm's RandAugment / AutoAugment / AugMix: the policy"),
    ),
    "PixelOpsSpec": (("list[PixelOp]", "ops", (), "a Pipeline's pixel ops, in order (at most 64)"),),
    "ErasingSpec": (
        ("bool", "mx_jitter", False, "MXNet's normalization jitter (float outputs)"),
        ("double", "max_random_contrast", 0.0, "MXNet: contrast jitter"),
        ("double", "max_random_illumination", 0.0, "MXNet: illumination jitter"),
        ("float[3]", "illumination_scale", (1.0, 1.0, 1.0), "MXNet: Normalize's scale / std per channel"),
        ("uint64", "mx_counter_base", 0, "MXNet: first counter of the MXNetColorAugment op"),
        ("bool", "erase", False, "RandomErasing is on"),
        ("double", "p", 0.5, "RandomErasing: probability"),
        ("double[2]", "scale", (0.02, 0.33), "RandomErasing: area fraction range"),
        ("double[2]", "log_ratio", (0.0, 0.0), "RandomErasing: log aspect ratio range"),
        ("bool", "random_value", False, "RandomErasing: random values (float: N(0, 1), uint8: 0..255)"),
        ("bool", "random_color", False, "RandomErasing: one random value per channel (timm's 'rand')"),
        ("double[3]", "value", (0.0, 0.0, 0.0), "RandomErasing: per-channel value (output units)"),
    ),
    "MixParams": (
        ("bool", "cutmix", False, "CutMix (else MixUp)"),
        ("double", "lam", 1.0, "MixUp weight of the sample itself"),
        ("int", "x0", 0, "CutMix box: left (pixels taken from the rolled batch)"),
        ("int", "y0", 0, "CutMix box: top"),
        ("int", "x1", 0, "CutMix box: right (exclusive)"),
        ("int", "y1", 0, "CutMix box: bottom (exclusive)"),
        ("double", "lam_labels", 1.0, "weight of the sample's own label (CutMix: adjusted by the box)"),
    ),
    # ---- warp geometries (fastload.transforms.warp / affine / mxnet_augment) -------------------
    "Affine2": (
        ("double", "a", 1.0, "x' = a x + b y + c"),
        ("double", "b", 0.0, "x' = a x + b y + c"),
        ("double", "c", 0.0, "x' = a x + b y + c"),
        ("double", "d", 0.0, "y' = d x + e y + f"),
        ("double", "e", 1.0, "y' = d x + e y + f"),
        ("double", "f", 0.0, "y' = d x + e y + f"),
    ),
    "WarpPlan": (
        ("int", "out_h", 0, "output height"),
        ("int", "out_w", 0, "output width"),
        ("Affine2", "to_frame", None, "output pixel centre -> frame point"),
        ("bool", "has_frame", False, "frame points outside `frame` get `fill`"),
        ("double[4]", "frame", (0.0, 0.0, 0.0, 0.0), "x0, y0, x1, y1 of the frame"),
        ("bool", "snap", False, "frame point -> centre of the frame pixel containing it"),
        ("Affine2", "to_source", None, "frame point -> source position (full-resolution pixels)"),
        ("double", "scale_x", 1.0, "source pixels per output pixel, x"),
        ("double", "scale_y", 1.0, "source pixels per output pixel, y"),
        ("WarpKernel", "kernel", "LINEAR", "interpolation kernel"),
        ("bool", "antialias", False, "widen the kernel by the downscale factor (Pillow's resize)"),
        ("double", "shift_x", 0.0, "added to the position before NEAREST picks its pixel, x"),
        ("double", "shift_y", 0.0, "added to the position before NEAREST picks its pixel, y"),
        ("WarpBorder", "border", "REPLICATE", "what taps outside the source read"),
        ("uint8[3]", "fill", (0, 0, 0), "RGB value outside the frame (and of CONSTANT taps)"),
        ("bool", "dct_scaling", False, "the source may be decoded at 1/2, 1/4, 1/8"),
        ("bool", "quantize", False, "evaluate to_source as cv::warpAffine (1/32-pixel positions)"),
    ),
    "AffineSpec": (
        ("double", "degrees_lo", 0.0, "rotation range, degrees"),
        ("double", "degrees_hi", 0.0, "rotation range, degrees"),
        ("bool", "has_translate", False, "translation is drawn"),
        ("double", "translate_x", 0.0, "largest translation, fraction of the output width"),
        ("double", "translate_y", 0.0, "largest translation, fraction of the output height"),
        ("bool", "has_scale", False, "scale is drawn"),
        ("double", "scale_lo", 1.0, "scale range"),
        ("double", "scale_hi", 1.0, "scale range"),
        ("int", "shear_count", 0, "0 (no shear), 2 (x range) or 4 (x and y ranges)"),
        ("double[4]", "shear", (0.0, 0.0, 0.0, 0.0), "shear ranges, degrees"),
        ("WarpKernel", "kernel", "NEAREST", "NEAREST, LINEAR or CUBIC (NEAREST snaps to the resized crop)"),
        ("uint8[3]", "fill", (0, 0, 0), "RGB value outside the transformed image"),
        ("bool", "has_center", False, "rotation centre given (else the output's centre)"),
        ("double", "center_x", 0.0, "rotation centre x, output pixels"),
        ("double", "center_y", 0.0, "rotation centre y, output pixels"),
    ),
    "MXNetAugmentSpec": (
        ("int", "out_h", 0, "data_shape[1]"),
        ("int", "out_w", 0, "data_shape[2]"),
        ("int", "resize", -1, "shorter side before the augmenter (-1: off)"),
        ("bool", "rand_crop", False, "random crop position"),
        ("bool", "random_resized_crop", False, "area-and-ratio crop"),
        ("int", "max_rotate_angle", 0, "largest random rotation, degrees"),
        ("float", "max_aspect_ratio", 0.0, "aspect ratio jitter"),
        ("bool", "has_min_aspect_ratio", False, "min_aspect_ratio is set"),
        ("float", "min_aspect_ratio", 0.0, "smallest aspect ratio"),
        ("float", "max_shear_ratio", 0.0, "shear jitter"),
        ("int", "max_crop_size", -1, "largest crop side (-1: off)"),
        ("int", "min_crop_size", -1, "smallest crop side (-1: off)"),
        ("float", "max_random_scale", 1.0, "scale jitter, upper"),
        ("float", "min_random_scale", 1.0, "scale jitter, lower"),
        ("float", "max_random_area", 1.0, "random_resized_crop: largest area fraction"),
        ("float", "min_random_area", 1.0, "random_resized_crop: smallest area fraction"),
        ("float", "max_img_size", 1e10, "largest side after scaling"),
        ("float", "min_img_size", 0.0, "smallest side after scaling"),
        ("int", "rotate", -1, "fixed rotation, degrees (-1: off)"),
        ("int", "fill_value", 255, "fill of the area the warp uncovers"),
        ("int", "inter_method", 1, "OpenCV interpolation code (0..4, 9, 10)"),
        ("int", "pad", 0, "padding before the crop"),
        ("bool", "rand_mirror", False, "random horizontal mirror"),
        ("bool", "mirror", False, "always mirror"),
    ),
    # ---- pack and restart index -----------------------------------------------------------------
    "TranscodeOptions": (
        ("int", "max_mcus", 4, "restart interval: the largest divisor of the MCU row width <= max_mcus"),
        ("bool", "verify", False, "decode both versions fully and require bit-identical pixels"),
    ),
    "RestartGeometry": (
        ("int", "width", 0, "frame width, pixels"),
        ("int", "height", 0, "frame height, pixels"),
        ("int", "components", 0, "colour components"),
        ("int", "mcu_width", 0, "MCU width, pixels"),
        ("int", "mcu_height", 0, "MCU height, pixels"),
        ("int", "mcus_per_row", 0, "MCU grid: columns"),
        ("int", "mcu_rows", 0, "MCU grid: rows"),
        ("int", "restart_interval", 0, "MCUs per restart interval (DRI); 0: no restart markers"),
        ("int", "intervals_per_row", 0, "mcus_per_row / restart_interval when it divides, else 0"),
        ("bool", "subsampled_x", False, "some component is horizontally subsampled"),
        ("bool", "subsampled_y", False, "some component is vertically subsampled"),
    ),
    "TranscodeNotes": (
        ("bool", "source_progressive", False, "the source was progressive"),
        ("bool", "source_arithmetic", False, "the source was arithmetic-coded"),
        ("int", "source_warnings", 0, "libjpeg warnings while reading the source (corrupt data)"),
        ("int64", "source_bytes", 0, "size of the source"),
        ("int64", "output_bytes", 0, "size of the transcoded JPEG"),
    ),
    # ---- arrays -------------------------------------------------------------------------------
    "RowGatherFailure": (
        ("int64", "row", -1, "first output row that could not be read in full (-1: none)"),
        ("int", "error", 0, "errno of the failed read (0: the file ended early)"),
    ),
}

#: Struct name -> docstring of its Python class.
STRUCT_DOCS: dict[str, str] = {
    "DecodeSettings": "Decoder options of one call (fastload.decode.DecodeOptions).",
    "GeometryParams": "The geometry op of a pipeline (fastload.transforms).",
    "OutputParams": "The output stage of a pipeline: dtype, layout, normalization.",
    "PolicyStep": "One step of an AutoAugment sub-policy.",
    "PolicyOp": "One candidate op of RandAugment / TrivialAugmentWide, with its magnitude table.",
    "TimmOp": "One op of a timm policy (timm.data.auto_augment.AugmentOp): name, probability, magnitude.",
    "TimmPolicy": "timm's RandAugment / AutoAugment / AugMix with the hparams its ops share.",
    "PixelOp": "One pixel op of a pipeline (the fields of its kind are read).",
    "PixelOpsSpec": "A pipeline's pixel ops, run on the output-sized image.",
    "ErasingSpec": "The ops on the final output: MXNet's normalization jitter, then RandomErasing.",
    "MixParams": "One batch's MixUp / CutMix draw.",
    "Affine2": "A 2x3 affine map.",
    "WarpPlan": "How one sample's output pixels are taken from its decoded image.",
    "AffineSpec": "torchvision's RandomAffine after the crop (fastload.transforms.RandomAffine).",
    "MXNetAugmentSpec": "MXNet's default augmenter geometry (fastload.transforms.MXNetDefaultAugment).",
    "TranscodeOptions": "Options of the lossless restart-marker transcode.",
    "RestartGeometry": "The MCU grid and restart interval a JPEG's headers describe.",
    "TranscodeNotes": "Side facts of one restart-marker transcode.",
    "RowGatherFailure": "The first row a gather could not read (row -1: every row was read).",
}


class Param(NamedTuple):
    """One parameter of an engine function: its name, its stub type, and its default if it has one."""

    name: str
    type: str
    default: Any = ...


class Function(NamedTuple):
    """One function of the engine: parameters, the stub's return type, the docstring."""

    params: tuple[Param, ...]
    returns: str
    doc: str


_P = Param
_IMAGES = _P("images", "Sequence[Buffer]")
_INDICES = _P("indices", "npt.ArrayLike")

#: Function name -> definition, grouped by the glue file that binds it (csrc/glue/).
FUNCTIONS: dict[str, Function] = {
    # ---- glue/module.cpp ----------------------------------------------------------------------
    "set_threads": Function(
        (_P("threads", "int"),), "None", "Resize the persistent pool to threads - 1 workers (the caller is the other)."
    ),
    "get_threads": Function((), "int", "Threads of the persistent pool (its workers + the caller)."),
    "info": Function(
        (),
        "dict[str, Any]",
        "Build facts: libjpeg-turbo version, resize, output and pixel-op kernels, whether the interval Huffman "
        "decoder is built, whether this is a sanitizer build.",
    ),
    "_pool_hold_creation_lock": Function(
        (_P("milliseconds", "int"),),
        "None",
        "Testing hook: a background thread holds the pool-creation lock for this long (fork-safety tests).",
    ),
    # ---- glue/decode.cpp ----------------------------------------------------------------------
    "decode_batch": Function(
        (
            _IMAGES,
            _P("out", "Buffer"),
            _P("geometry", "GeometryParams"),
            _P("output", "OutputParams"),
            _P("ops", "PixelOpsSpec"),
            _P("erasing", "ErasingSpec"),
            _P("seed", "int"),
            _P("epoch", "int"),
            _INDICES,
            _P("threads", "int"),
            _P("options", "DecodeSettings"),
            _P("want_params", "bool", False),
            _P("affine", "AffineSpec | None", None),
            _P("mxnet", "MXNetAugmentSpec | None", None),
            _P("mix", "MixParams | None", None),
        ),
        "dict[str, Any]",
        "Decode a batch into out (GIL released once) through the pipeline geometry (mxnet: the augmenter of "
        "an MXNET_AUGMENT geometry; affine: a RandomAffine after the crop) -> pixel ops -> output stage (dtype, "
        "layout, normalization) -> erasing; returns a dict of per-image results (with want_params, the pixel "
        "ops' traces [B, ops, 64], the output stage's [B, 8] and the warp's draws [B, 18], RandomAffine's in "
        "the first 6 columns). mix: the batch's MixUp / CutMix draw, fused into the output stage; 'mixed' says "
        "whether it was applied (every image decoded).",
    ),
    "decode_image": Function(
        (_P("buf", "Buffer"), _P("options", "DecodeSettings")),
        "tuple[Status, str, npt.NDArray[np.uint8] | None]",
        "Full-size RGB decode: (status, message, array or None).",
    ),
    "_resize_force_kernels": Function(
        (_P("name", "str"),),
        "bool",
        "Testing hook: resample (and write the output) with the 'scalar', 'ssse3', 'avx2' or 'best' kernels; "
        "False if unavailable.",
    ),
    "_force_hwc_scratch": Function(
        (_P("on", "bool"),),
        "None",
        "Testing hook: every image goes through the per-thread HWC scratch and the whole-image output write.",
    ),
    # ---- glue/pixel.cpp -----------------------------------------------------------------------
    "pixel_ops_batch": Function(
        (
            _P("images", "npt.NDArray[np.uint8]"),
            _P("ops", "PixelOpsSpec"),
            _P("seed", "int"),
            _P("epoch", "int"),
            _INDICES,
            _P("threads", "int"),
            _P("want_trace", "bool"),
        ),
        "npt.NDArray[np.float64] | None",
        "Run pixel ops on [B, H, W, 3] uint8 images in place; traces [B, ops, 64] or None.",
    ),
    "erasing_batch": Function(
        (
            _P("images", "npt.NDArray[Any]"),
            _P("channels_first", "bool"),
            _P("spec", "ErasingSpec"),
            _P("seed", "int"),
            _P("epoch", "int"),
            _INDICES,
            _P("threads", "int"),
            _P("want_trace", "bool"),
        ),
        "npt.NDArray[np.float64] | None",
        "Run the output-stage ops (MXNet jitter, RandomErasing) on a batch in place; traces [B, 8] or None.",
    ),
    "mix_batch": Function(
        (
            _P("images", "npt.NDArray[Any]"),
            _P("labels", "npt.ArrayLike"),
            _P("soft", "npt.NDArray[np.float32]"),
            _P("params", "MixParams"),
            _P("channels_first", "bool"),
            _P("threads", "int"),
        ),
        "None",
        "MixUp / CutMix a batch in place (one call, GIL released); soft receives the mixed labels.",
    ),
    "pixel_prim": Function(
        (
            _P("image", "npt.NDArray[np.uint8]"),
            _P("prim", "PixelPrim"),
            _P("magnitude", "float"),
            _P("warp", "Sequence[float]"),
            _P("bilinear", "bool"),
            _P("fill", "Sequence[int]"),
        ),
        "None",
        "Testing hook: one pixel primitive with fixed parameters, in place (warp: 7 numbers for the geometric "
        "primitives, else empty).",
    ),
    "pixel_mx_prim": Function(
        (_P("image", "npt.NDArray[np.uint8]"), _P("step", "MXNetColorStep"), _P("args", "Sequence[float]")),
        "None",
        "Testing hook: one step of MXNet's colour augmenter, in place (BRIGHTNESS, CONTRAST, SATURATION: "
        "(alpha,); HLS: (dh, dl, ds); PCA: (r, g, b)).",
    ),
    "pixel_kernels": Function(
        (_P("name", "str"),),
        "bool",
        "Testing hook: pixel-op kernels 'scalar', 'avx512' or 'best'; False if unavailable.",
    ),
    "pixel_kernel_name": Function((), "str", "Name of the SIMD kernels the pixel ops use."),
    "_warp_affine_plan": Function(
        (
            _P("spec", "AffineSpec"),
            _P("box", "tuple[float, float, float, float]"),
            _P("flip", "bool"),
            _P("out_h", "int"),
            _P("out_w", "int"),
            _P("key", "int"),
            _P("crop_kernel", "WarpKernel", WarpKernel.LINEAR),
            _P("crop_antialias", "bool", True),
        ),
        "tuple[WarpPlan, tuple[float, ...]]",
        "Testing hook: the engine's RandomAffine plan and drawn (angle, tx, ty, scale, shear_x, shear_y).",
    ),
    "_warp_mxnet_plan": Function(
        (_P("spec", "MXNetAugmentSpec"), _P("width", "int"), _P("height", "int"), _P("key", "int")),
        "tuple[WarpPlan, tuple[float, ...]]",
        "Testing hook: the engine's MXNetDefaultAugment plan and parameters (MXNET_PARAM_NAMES order).",
    ),
    "_warp_image": Function(
        (_P("src", "npt.NDArray[np.uint8]"), _P("plan", "WarpPlan")),
        "npt.NDArray[np.uint8]",
        "Testing hook: evaluate a WarpPlan on a full-resolution [H, W, 3] uint8 image.",
    ),
    "_warp_source_rect": Function(
        (_P("plan", "WarpPlan"), _P("denom", "int"), _P("scaled_w", "int"), _P("scaled_h", "int")),
        "tuple[int, int, int, int]",
        "Testing hook: the source rectangle (x0, y0, x1, y1) the plan reads at DCT scale 1/denom.",
    ),
    "_warp_decode": Function(
        (_P("buf", "Buffer"), _P("plan", "WarpPlan"), _P("options", "DecodeSettings")),
        "tuple[int, str, npt.NDArray[np.uint8] | None, int]",
        "Testing hook: region decode + warp of one JPEG: (status, message, image or None, denom).",
    ),
    # ---- glue/pack.cpp ------------------------------------------------------------------------
    "resize_encode_batch": Function(
        (_IMAGES, _P("shorter", "int"), _P("quality", "int"), _P("threads", "int"), _P("options", "DecodeSettings")),
        "list[tuple[Status, str, bytes | None]]",
        "Decode, resize (shorter side to `shorter`, im2rec's arithmetic) and re-encode at `quality` each image, "
        "in one GIL-free call; returns [(status, message, jpeg_bytes or None)].",
    ),
    "frame_files": Function(
        (
            _P("paths", "Sequence[bytes]"),
            _P("sizes", "Sequence[int]"),
            _P("heads", "Sequence[Buffer]"),
            _P("out", "Buffer"),
        ),
        "tuple[npt.NDArray[np.int64], int]",
        "Read, check and frame a batch of files as RecordIO records (payload = head + file bytes) into out in "
        "one GIL-free call; out needs 1 + sum(8 + round_up_4(len(head) + size)) bytes. Returns (framed_sizes, "
        "used): records back to back from out[0], framed_sizes[i] > 0 for a framed record, < 0 for a file left "
        "to the Python path.",
    ),
    "add_restart_markers": Function(
        (_P("buf", "Buffer"), _P("options", "TranscodeOptions")),
        "tuple[bytes, RestartGeometry, TranscodeNotes]",
        "Losslessly add restart markers every N MCUs (N = largest divisor of the MCU row width <= "
        "options.max_mcus); returns (jpeg_bytes, geometry, notes). options.verify decodes both and requires "
        "bit-identical pixels. Raises ValueError with libjpeg's message.",
    ),
    "restart_geometry": Function(
        (_P("buf", "Buffer"),),
        "RestartGeometry | None",
        "The restart geometry (frame, MCU grid, DRI) a baseline JPEG's headers claim, or None.",
    ),
    "restart_slice": Function(
        (
            _P("buf", "Buffer"),
            _P("x", "int"),
            _P("y", "int"),
            _P("w", "int"),
            _P("h", "int"),
            _P("scale_denom", "int", 1),
        ),
        "tuple[bytes, int, int]",
        "A small JPEG made of the restart intervals covering the crop: (jpeg_bytes, x0, y0) in full-size "
        "pixels; crop (x - x0, y - y0, w, h) from its decode. With scale_denom d the slice is meant to be "
        "decoded at 1/d: scaled pixels [x/d, ceil((x+w)/d)) then match a 1/d decode of the whole image, at "
        "offset x0/d. Raises ValueError when the markers do not match the geometry the headers claim.",
    ),
    "restart_verify": Function(
        (_P("a", "Buffer"), _P("b", "Buffer")),
        "bool",
        "Whether two JPEGs decode to bit-identical pixels (libjpeg defaults).",
    ),
    "_restart_force_scalar_scan": Function(
        (_P("scalar", "bool"),),
        "None",
        "Testing hook: the slicer's portable interval scan instead of the AVX-512 one.",
    ),
    # ---- glue/arrays.cpp ----------------------------------------------------------------------
    "gather_rows": Function(
        (
            _P("fds", "npt.NDArray[np.int32]"),
            _P("offsets", "npt.NDArray[np.int64]"),
            _P("row_bytes", "int"),
            _P("out", "Buffer"),
        ),
        "RowGatherFailure",
        "Read row i (row_bytes bytes of file fds[i] at offsets[i]) into out[i] for every row, with pread, in one "
        "GIL-free call (runs of consecutive rows are one read). Returns the first row that was not read in full "
        "(row -1: every row was read; error 0: the file ended early).",
    ),
    # ---- glue/ingest.cpp ----------------------------------------------------------------------
    "frame_buffers": Function(
        (
            _IMAGES,
            _P("heads", "Sequence[Buffer]"),
            _P("max_pixels", "int"),
            _P("gather", "bool"),
            _P("out", "Buffer"),
        ),
        "tuple[npt.NDArray[np.int64], int]",
        "Check and frame a batch of in-memory images as RecordIO records (payload = head + image) in one "
        "GIL-free call, with frame_files' checks. gather=False: the records framed whole into out, back to back "
        "(out needs sum(8 + round_up_4(len(head) + len(image))) bytes); gather=True: the images are not copied "
        "and out holds what goes between them: per framed record, the previous one's zero padding, then its "
        "magic, length word and head; after the last, its padding (out needs sum(11 + len(head)) bytes). "
        "Returns (framed_sizes, used): framed_sizes[i] > 0 for a framed record (its whole size), < 0 for an "
        "image left to the Python path (-3 not a passable JPEG, -4 holds the magic word, -5 over the record "
        "limit, -6 declares more than max_pixels pixels).",
    ),
    "walk_tar": Function(
        (_P("buf", "Buffer"), _P("pos", "int"), _P("max_members", "int")),
        "tuple[list[str], npt.NDArray[np.int64], int]",
        "Walk the whole tar members of buf from pos (a member's first header) in one GIL-free call: (names, "
        "rows of [first header offset, data offset, size, type flag byte], where it stopped). It stops at the "
        "first member it leaves to the Python reader (damaged or unusual headers, PAX global headers, sparse "
        "members, a member running past the buffer, the end-of-archive block).",
    ),
}
