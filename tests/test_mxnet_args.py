"""fastload.mxnet.arguments / augmenter: MXNet's ImageRecordIter argument set, parsing, errors and the spec mapping."""

from __future__ import annotations

import dataclasses
import re
import warnings

import pytest

mx = pytest.importorskip("mxnet")

import fastload.transforms as transforms
from fastload.mxnet import augmenter
from fastload.mxnet.arguments import (
    PARAMS,
    MXNetArgumentError,
    UnknownArgumentWarning,
    parse_args,
)

BASE = dict(path_imgrec="x.rec", data_shape=(3, 20, 20), batch_size=4)


def _mxnet_declared():
    """Every ImageRecordIter parameter MXNet's own docstring declares: name -> (type text, default text)."""
    doc = mx.io.ImageRecordIter.__doc__
    out = {}
    for m in re.finditer(r"^(\w+) : (.*?),\s*(optional, default=(.*)|required)\s*$", doc, re.M):
        out[m.group(1)] = (m.group(2), m.group(4))
    return out


def _parse_default(text: str):
    text = text.strip().strip("'")
    return None if text == "None" else text


def test_every_mxnet_parameter_is_parsed_with_mxnet_default():
    declared = _mxnet_declared()
    assert len(declared) >= 60, sorted(declared)  # the docstring was read
    ours = {p.name: p for p in PARAMS}
    missing = sorted(set(declared) - set(ours))
    assert not missing, f"MXNet parameters fastload does not parse: {missing}"
    args = parse_args(BASE)
    for name, (kind, default) in declared.items():
        if default is None or name in BASE:  # required
            continue
        expected = _parse_default(default)
        got = args[name]
        if expected is None:
            assert got is None, name
        elif kind.startswith("boolean"):
            assert got is bool(int(expected)), name
        elif isinstance(got, str):
            assert got == expected, name
        else:
            assert float(got) == float(expected), (name, got, expected)


def test_values_are_parsed_as_mxnet_parses_their_strings():
    a = parse_args(
        dict(
            BASE,
            rand_crop=1,
            rand_mirror="True",
            data_shape="(3, 20, 20)",
            seed_aug="None",
            min_aspect_ratio="0.75",
            max_aspect_ratio=4 / 3,
            resize="30",
            mean_r="123.68",
        )
    )
    assert a.rand_crop is True and a.rand_mirror is True
    assert a.data_shape == (3, 20, 20) and a.seed_aug is None
    assert a.min_aspect_ratio == 0.75 and a.resize == 30 and a.mean_r == pytest.approx(123.68)
    assert parse_args(dict(BASE, data_shape=[1, 8, 9])).data_shape == (1, 8, 9)
    assert parse_args(dict(BASE, dtype=None)).dtype is None
    assert parse_args(dict(BASE, seed_aug=3)).seed_aug == 3
    assert parse_args(BASE).is_default("resize") and not a.is_default("resize")


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("resize", 3.5, "expected an int"),
        ("rand_crop", 2, "expected a boolean"),
        ("data_shape", (3, 20), "3 dimensions"),
        ("data_shape", (3, 0, 20), "nonzero"),
        ("data_shape", (5, 20, 20), "channels must be 1"),
        ("preprocess_threads", 0, ">= 1"),
        ("label_width", 0, ">= 1"),
        ("part_index", 2, "num_parts"),
        ("inter_method", 5, "must be 0"),
        ("dtype", "float64", "produces"),
        ("dtype", "not-a-dtype", "expected one of"),
        ("ctx", "tpu", "'cpu', 'gpu'"),
        ("std_g", 0, "positive"),
        ("scale", 0, "nonzero"),
        ("mean_b", "nan", "finite"),
        ("max_rotate_angle", -5, ">= 0"),
        ("shuffle_chunk_size", -1, ">= 0"),
        ("fill_value", 300, "0..255"),
        ("aug_seq", "det_aug_default", "aug_default"),
        ("batch_size", 0, ">= 1"),
    ],
)
def test_bad_values_raise_mxnet_error_naming_the_argument(name, value, message):
    kwargs = dict(BASE, **{name: value})
    if name == "part_index":
        kwargs["num_parts"] = 2
    with pytest.raises(MXNetArgumentError, match=message) as info:
        parse_args(kwargs)
    assert isinstance(info.value, mx.base.MXNetError) and isinstance(info.value, ValueError)
    assert name in str(info.value)


def test_required_arguments_and_conflicts():
    for name in ("data_shape", "batch_size"):
        with pytest.raises(MXNetArgumentError, match=name):
            parse_args({k: v for k, v in BASE.items() if k != name})
    with pytest.raises(MXNetArgumentError, match="path_imgrec"):
        parse_args(dict(BASE, path_imgrec=""))
    with pytest.raises(MXNetArgumentError, match="conflicts"):
        parse_args(dict(BASE, rand_crop=True, random_resized_crop=True))


def test_unknown_arguments_are_ignored_with_one_warning_naming_them():
    with pytest.warns(UnknownArgumentWarning) as record:
        args = parse_args(dict(BASE, and_mirror=False, bogus=3))
    assert len(record) == 1
    assert "and_mirror" in str(record[0].message) and "bogus" in str(record[0].message)
    assert args.unknown == ("and_mirror", "bogus")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parse_args(dict(BASE, kvstore=None, work_load_list=None))  # fastload extras are known


# --- the mapping onto the spec classes of the transform contract ---------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class StandInAugment:
    """The contract's MXNetDefaultAugment fields (MXNet's names and defaults); records what it is given."""

    data_shape: tuple[int, int, int]
    resize: int = -1
    rand_crop: bool = False
    random_resized_crop: bool = False
    max_rotate_angle: int = 0
    max_aspect_ratio: float = 0.0
    min_aspect_ratio: float | None = None
    max_shear_ratio: float = 0.0
    max_crop_size: int = -1
    min_crop_size: int = -1
    max_random_scale: float = 1.0
    min_random_scale: float = 1.0
    max_random_area: float = 1.0
    min_random_area: float = 1.0
    max_img_size: float = 1e10
    min_img_size: float = 0.0
    rotate: int = -1
    fill_value: int = 255
    inter_method: int = 1
    pad: int = 0
    rand_mirror: bool = False
    mirror: bool = False

    def __post_init__(self):
        if self.pad > 100:
            raise ValueError(f"pad={self.pad} is too large")


@dataclasses.dataclass(frozen=True, kw_only=True)
class StandInColor:
    brightness: float = 0.0
    contrast: float = 0.0
    saturation: float = 0.0
    pca_noise: float = 0.0
    random_h: int = 0
    random_s: int = 0
    random_l: int = 0
    max_random_contrast: float = 0.0
    max_random_illumination: float = 0.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class StandInNormalize:
    mean: tuple
    std: tuple
    scale: float
    dtype: str


@pytest.fixture
def contract_specs(monkeypatch):
    monkeypatch.setattr(transforms, "MXNetDefaultAugment", StandInAugment, raising=False)
    monkeypatch.setattr(transforms, "MXNetColorAugment", StandInColor, raising=False)
    monkeypatch.setattr(transforms, "Normalize", StandInNormalize, raising=False)


def test_geometry_maps_every_argument_under_mxnet_name(contract_specs):
    level3 = dict(
        BASE,
        rand_crop=True,
        rand_mirror=True,
        max_random_h=36,
        random_h=36,
        random_s=50,
        random_l=50,
        max_rotate_angle=10,
        max_shear_ratio=0.1,
        max_aspect_ratio=0.25,
        pad=4,
        fill_value=127,
        inter_method=2,
        resize=32,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnknownArgumentWarning)
        args = parse_args(level3)
    op = augmenter.geometry_spec(args)
    assert isinstance(op, StandInAugment)
    assert (
        op.data_shape,
        op.rand_crop,
        op.rand_mirror,
        op.max_rotate_angle,
        op.max_shear_ratio,
        op.max_aspect_ratio,
        op.pad,
        op.fill_value,
        op.inter_method,
        op.resize,
    ) == ((3, 20, 20), True, True, 10, 0.1, 0.25, 4, 127, 2, 32)
    # rotate_list is an MXNet argument the contract's class does not declare: refused, not dropped.
    with pytest.raises(MXNetArgumentError, match="rotate_list"):
        augmenter.geometry_spec(parse_args(dict(BASE, rotate_list="0,90")))
    # The class's own validation surfaces as MXNet's error type.
    with pytest.raises(MXNetArgumentError, match="pad=200"):
        augmenter.geometry_spec(parse_args(dict(BASE, pad=200)))


def test_color_and_normalize_map_with_mxnet_semantics(contract_specs):
    gluoncv = parse_args(
        dict(
            BASE,
            brightness=0.4,
            contrast=0.4,
            saturation=0.4,
            pca_noise=0.1,
            max_random_contrast=0.3,
            mean_r=123.68,
            mean_g=116.28,
            mean_b=103.53,
            std_r=58.395,
            std_g=57.12,
            std_b=57.375,
            scale=2.0,
        )
    )
    color = augmenter.color_spec(gluoncv, "float32")
    assert (color.brightness, color.contrast, color.saturation, color.pca_noise, color.max_random_contrast) == (
        0.4,
        0.4,
        0.4,
        0.1,
        0.3,
    )
    assert augmenter.color_spec(parse_args(BASE), "float32") is None
    # MXNet applies the random contrast / illumination in its float normalizer only.
    only_norm_random = parse_args(dict(BASE, max_random_contrast=0.3))
    assert augmenter.color_spec(only_norm_random, "uint8") is None
    norm = augmenter.normalize_spec(gluoncv, "float32")
    # (pixel - mean) * scale / std == (pixel - mean) / (std / scale)
    assert norm.mean == (123.68, 116.28, 103.53) and norm.scale == 1.0 and norm.dtype == "float32"
    assert norm.std == pytest.approx((58.395 / 2, 57.12 / 2, 57.375 / 2))
    # The adapter keeps what the engine's Normalize cannot express.
    assert augmenter.normalize_spec(gluoncv, "uint8") is None
    assert augmenter.normalize_spec(gluoncv, "int8") is None
    assert augmenter.normalize_spec(parse_args(dict(BASE, mean_img="m.bin")), "float32") is None
    assert augmenter.normalize_spec(parse_args(dict(BASE, data_shape=(1, 20, 20))), "float32") is None


def test_geometric_arguments_build_the_engine_mxnet_default_augment():
    # The real class (not the contract's stand-in): --aug-level 3's arguments turn its warp on.
    aug3 = dict(
        BASE,
        fill_value=127,
        rand_crop=True,
        rand_mirror=True,
        max_random_scale=1.0,
        min_random_scale=0.533,
        max_aspect_ratio=0.25,
        max_rotate_angle=10,
        max_shear_ratio=0.1,
        pad=4,
    )
    op = augmenter.geometry_spec(parse_args(aug3))
    assert isinstance(op, transforms.MXNetDefaultAugment)
    assert (op.fill_value, op.rand_crop, op.rand_mirror, op.min_random_scale, op.max_rotate_angle, op.pad) == (
        127,
        True,
        True,
        0.533,
        10,
        4,
    )
    assert op.max_shear_ratio == pytest.approx(0.1) and op.has_warp
    assert op.data_shape == tuple(BASE["data_shape"])
    # MXNet's own refusals keep MXNet's error type and name the argument.
    with pytest.raises(MXNetArgumentError, match="random_resized_crop"):
        augmenter.geometry_spec(parse_args(dict(BASE, random_resized_crop=True, rand_crop=True)))
    with pytest.raises(MXNetArgumentError, match="inter_method"):
        augmenter.geometry_spec(parse_args(dict(BASE, max_rotate_angle=10, inter_method=0)))
    assert augmenter.normalize_spec(parse_args(BASE), "float32") is not None
    assert augmenter.normalize_spec(parse_args(BASE), "uint8") is None


def test_augmentation_seed_is_seed_aug_else_seed():
    assert augmenter.aug_seed(parse_args(dict(BASE, seed=5))) == 5
    assert augmenter.aug_seed(parse_args(dict(BASE, seed=5, seed_aug=3))) == 3
    assert augmenter.aug_seed(parse_args(dict(BASE, seed=-1))) == 0xFFFFFFFF
