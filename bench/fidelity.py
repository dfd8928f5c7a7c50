"""Measurement stage, geometry fidelity: the engine's eval and train pixels against torchvision's own
PIL pipeline at every output size, and what the DCT-scaled decode still saves.

For each output size ``s``:

* eval: ``Resize(int(s * 8 / 7))`` + ``CenterCrop(s)`` (Resize(256) + CenterCrop(224) at 224);
* train: ``RandomResizedCrop(s)`` + ``RandomHorizontalFlip()``, the engine's sampled box and flip
  replayed through torchvision's ``resized_crop`` and ``hflip`` on the PIL image (so both sides crop
  the same box);

then ``ToTensor()`` + ``Normalize(ImageNet mean, std)`` on torchvision's side, and on fastload's the
engine's ``decode_batch`` with the same geometry and ``Normalize`` fused (float32 out, default
``DecodeOptions``: the DCT-scaled decode wherever its rule allows it). Per image: the mean absolute
difference over pixels and channels, in normalized units; per size: its median and its maximum over
the images, which must stay within :data:`BOUND`.

Images: realistic generated JPEGs (``tools/make_dataset.py``: ImageNet-sized, about 400x350 px) and
camera-sized renders of the same generator (1024 to 2592 px wide), where the 1/4 and 1/8 DCT scales
apply at larger output sizes.

Speed (``--speed``): per size, the default decode against ``dct_scaling=False`` (always a full-size
decode), alternated chunk by chunk (:func:`bench.paired.paired_ratio`): what the DCT shortcut saves
where its rule still applies it (1.00 where it does not).

Residual (``--residual``): why the rule leaves the resize a 4x step at 1/2 and 5x deeper, measured apart from the
engine: Pillow's own DCT-scaled decode (``draft``) then its resize over the scaled box, against its
resize of the full decode, tabulated by the scale d and the shrink g the resize still does.

Run ``python -m bench.fidelity [--sizes 32:512] [--images 48] [--large 12] [--speed] [--residual]
[--out DIR]``;
``--quick`` is the smoke run the tests use.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["BOUND", "MEAN", "STD", "SizeFidelity", "load_images", "main", "measure_size", "parse_sizes", "speed"]

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
#: Largest per-image mean absolute difference to torchvision allowed at any size (normalized units).
BOUND = 0.02
#: Sizes of the camera-sized renders (width, height), cycled.
LARGE_SIZES = ((1024, 768), (1600, 1200), (2048, 1365), (2592, 1944), (1200, 1600))


@dataclass
class SizeFidelity:
    """One output size: the per-image differences of eval and train, and their summary."""

    size: int
    interpolation: str
    eval: list[float]
    train: list[float]

    def summary(self) -> dict:
        return {
            "size": self.size,
            "interpolation": self.interpolation,
            "eval_median": float(np.median(self.eval)),
            "eval_max": float(np.max(self.eval)),
            "train_median": float(np.median(self.train)),
            "train_max": float(np.max(self.train)),
            "within": max(max(self.eval), max(self.train)) <= BOUND,
        }


def parse_sizes(text: str) -> list[int]:
    """``"32:512"`` (every size), ``"32:512:8"`` (a stride; the last size always included) or ``"64,112,224"``."""
    if ":" in text:
        parts = [int(p) for p in text.split(":")]
        lo, hi, step = parts[0], parts[1], parts[2] if len(parts) > 2 else 1
        sizes = list(range(lo, hi + 1, step))
        return sizes if sizes[-1] == hi else [*sizes, hi]
    return [int(p) for p in text.split(",") if p]


def load_images(folder: str, *, images: int, large: int, seed: int = 0) -> list[bytes]:
    """``images`` generated ImageNet-sized JPEGs plus ``large`` camera-sized renders (written under ``folder``)."""
    from tools.make_dataset import encode_jpeg, make_dataset, render_image

    out: list[bytes] = []
    if images:
        root = os.path.join(folder, "imagenet-like")
        make_dataset(root, count=images, seed=seed, classes=4, workers=2, quiet=True)
        for dirpath, _, files in sorted(os.walk(root)):
            for name in sorted(files):
                if name.endswith(".JPEG"):
                    with open(os.path.join(dirpath, name), "rb") as fh:
                        out.append(fh.read())
    for k in range(large):
        w, h = LARGE_SIZES[k % len(LARGE_SIZES)]
        out.append(encode_jpeg(render_image(w, h, seed=seed * 1000 + k), quality=90 - (k % 3) * 5))
    return out


def _reference(pil, mode, *, size: int, box=None, flip: bool = False) -> np.ndarray:
    """torchvision's PIL pipeline, HWC float32 normalized."""
    import torchvision.transforms.functional as F

    if box is None:
        img = F.center_crop(F.resize(pil, int(size * 8 / 7), mode), size)
    else:
        x0, y0, x1, y1 = (int(v) for v in box)
        img = F.resized_crop(pil, y0, x0, y1 - y0, x1 - x0, [size, size], mode)
        if flip:
            img = F.hflip(img)
    return F.normalize(F.to_tensor(img), MEAN, STD).permute(1, 2, 0).numpy()


def measure_size(
    data: Sequence[bytes], pils: Sequence, size: int, *, interpolation: str = "bilinear", seed: int = 0
) -> SizeFidelity:
    """Per-image differences at one output size (eval and train) against torchvision's PIL pipeline."""
    from torchvision.transforms import InterpolationMode

    from fastload import decode
    from fastload import transforms as T

    mode = InterpolationMode(interpolation)
    normalize = T.Normalize(mean=MEAN, std=STD)
    n = len(data)
    out = np.empty((n, size, size, 3), np.float32)
    per: dict[str, list[float]] = {}
    for kind in ("eval", "train"):
        if kind == "eval":
            geometry = T.CenterCrop(size=size, resize=int(size * 8 / 7), interpolation=interpolation)
        else:
            geometry = T.RandomResizedCrop(size=size, interpolation=interpolation)
        res = decode.decode_batch(
            data,
            out,
            T.Pipeline(geometry=geometry, normalize=normalize),
            seed=seed,
            epoch=size,
            indices=np.arange(n),
            layout="NHWC",
            want_params=kind == "train",
        )
        if not res.ok:
            raise RuntimeError(f"decode failed at size {size}: {res.errors}")
        diffs = []
        for i in range(n):
            if kind == "eval":
                ref = _reference(pils[i], mode, size=size)
            else:
                ref = _reference(pils[i], mode, size=size, box=res.boxes[i], flip=bool(res.flips[i]))
            diffs.append(float(np.abs(out[i] - ref).mean()))
        per[kind] = diffs
    return SizeFidelity(size=size, interpolation=interpolation, eval=per["eval"], train=per["train"])


def speed(data: Sequence[bytes], size: int, *, rounds: int = 3, chunk: int = 16, threads: int = 1) -> dict:
    """Default decode (DCT rule) over ``dct_scaling=False``, eval and train, paired by chunks."""
    from fastload import decode
    from fastload import transforms as T

    from .paired import paired_ratio

    rows = {}
    n = len(data)
    for kind in ("eval", "train"):
        geometry = (
            T.CenterCrop(size=size, resize=int(size * 8 / 7)) if kind == "eval" else T.RandomResizedCrop(size=size)
        )
        pipeline = T.Pipeline(geometry=geometry, normalize=T.Normalize(mean=MEAN, std=STD))
        out = np.empty((chunk, size, size, 3), np.float32)

        def work(options, pipeline=pipeline, out=out):
            def run(lo: int, hi: int) -> None:
                decode.decode_batch(
                    data[lo:hi],
                    out[: hi - lo],
                    pipeline,
                    seed=0,
                    epoch=0,
                    indices=np.arange(lo, hi),
                    layout="NHWC",
                    threads=threads,
                    options=options,
                )

            return run

        ratio = paired_ratio(
            f"{kind} {size}: default / dct_scaling=False",
            "default",
            work(decode.DecodeOptions()),
            "dct_scaling=False",
            work(decode.DecodeOptions(dct_scaling=False)),
            images=n,
            chunk=min(chunk, n),
            rounds=rounds,
        )
        rows[kind] = {"median": ratio.median, "q1": ratio.q1, "q3": ratio.q3, "pairs": ratio.pairs}
    return rows


#: Bins of the shrink left to the resize after a DCT-scaled decode (``--residual``).
RESIDUAL_BINS = (1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0)


def _residual_bin(g: float) -> int | None:
    for k in range(len(RESIDUAL_BINS) - 1):
        if RESIDUAL_BINS[k] <= g < RESIDUAL_BINS[k + 1]:
            return k
    return None


def residual_table(data: Sequence[bytes], *, interpolation: str = "bilinear") -> list[dict]:
    """Why the rule leaves the resize a 4x (1/2) or 5x step: the difference a 1/d DCT-scaled decode makes, by the
    shrink ``g`` the resize does afterwards, independent of the engine's rule.

    For each image, Pillow decodes it at 1/d scale (``draft``: libjpeg's scaled IDCT, as the engine)
    and resizes that with its filter over the scaled box, against Pillow's resize of the full decode;
    shorter sides 16 to 224 give shrinks f of 2 and more, and each (d, g = f / d) lands in a bin.

    Returns:
        Rows ``{"denom", "g_low", "g_high", "images", "median", "max"}`` (normalized units).
    """
    import io

    from PIL import Image

    resample = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}[interpolation]
    std = np.asarray(STD, np.float64) * 255.0
    found: dict[tuple[int, int], list[float]] = {}
    for b in data:
        full = Image.open(io.BytesIO(b)).convert("RGB")
        w, h = full.size
        for short in (16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224):
            if short >= min(w, h):
                continue
            size = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
            ref = np.asarray(full.resize(size, resample), np.float64)
            f = min(w, h) / short
            for d in (2, 4, 8):
                k = _residual_bin(f / d)
                if k is None:
                    continue
                scaled = Image.open(io.BytesIO(b))
                got = scaled.draft("RGB", (w // d, h // d))
                if got is None or abs(w / got[1][2] - d) > 1e-9:
                    continue  # Pillow picked another scale
                out = np.asarray(scaled.convert("RGB").resize(size, resample, box=got[1]), np.float64)
                found.setdefault((d, k), []).append(float((np.abs(out - ref) / std).mean()))
    return [
        {
            "denom": d,
            "g_low": RESIDUAL_BINS[k],
            "g_high": RESIDUAL_BINS[k + 1],
            "images": len(v),
            "median": float(np.median(v)),
            "max": float(np.max(v)),
        }
        for (d, k), v in sorted(found.items())
    ]


def run(
    sizes: Sequence[int],
    *,
    images: int,
    large: int,
    interpolations: Sequence[str] = ("bilinear",),
    with_speed: bool = False,
    speed_rounds: int = 3,
    residual: bool = False,
    argv: Sequence[str] = (),
    log=sys.stderr,
) -> dict:
    import io

    from PIL import Image

    from .harness import environment

    with tempfile.TemporaryDirectory(prefix="fastload-fidelity-") as tmp:
        data = load_images(tmp, images=images, large=large)
    pils = [Image.open(io.BytesIO(b)).convert("RGB") for b in data]
    rows = []
    for interpolation in interpolations:
        for size in sizes:
            row = measure_size(data, pils, size, interpolation=interpolation).summary()
            if with_speed and interpolation == interpolations[0]:
                row["speed"] = speed(data, size, rounds=speed_rounds)
            rows.append(row)
            print(
                f"{interpolation} {size}: eval {row['eval_median']:.4f} / {row['eval_max']:.4f}, "
                f"train {row['train_median']:.4f} / {row['train_max']:.4f}",
                file=log,
                flush=True,
            )
    report = {
        "environment": environment(list(argv)),
        "images": {"imagenet_like": images, "camera_sized": large},
        "bound": BOUND,
        "rows": rows,
    }
    if residual:
        report["residual"] = {i: residual_table(data, interpolation=i) for i in interpolations}
    return report


def format_report(report: dict) -> str:
    lines = [
        f"command: {report['environment']['command']}",
        f"images: {report['images']['imagenet_like']} ImageNet-sized, {report['images']['camera_sized']} camera-sized; "
        f"per-image mean absolute difference to torchvision's PIL pipeline, normalized units (bound {report['bound']})",
        "",
        f"{'mode':<9} {'size':>4}  {'eval median':>11} {'eval max':>9}  {'train median':>12} {'train max':>9}"
        f"  {'speed eval':>10} {'speed train':>11}",
    ]
    for r in report["rows"]:
        sp = r.get("speed")
        speeds = f"{sp['eval']['median']:>9.2f}x {sp['train']['median']:>10.2f}x" if sp else ""
        flag = "" if r["within"] else "  OVER"
        lines.append(
            f"{r['interpolation']:<9} {r['size']:>4}  {r['eval_median']:>11.4f} {r['eval_max']:>9.4f}  "
            f"{r['train_median']:>12.4f} {r['train_max']:>9.4f}  {speeds}{flag}"
        )
    if any("speed" in r for r in report["rows"]):
        lines += ["", "speed: default decode / dct_scaling=False (images/s ratio, median of alternated chunks)"]
    for interpolation, table in report.get("residual", {}).items():
        lines += [
            "",
            f"{interpolation}: a 1/d DCT-scaled decode then Pillow's resize, against Pillow's resize of the full",
            "decode, by the shrink g the resize does after the DCT scale (per-image mean absolute difference,",
            "normalized units)",
            f"{'d':>2} {'g':>9} {'images':>6} {'median':>7} {'max':>7}",
        ]
        for r in table:
            g = f"{r['g_low']:>4.1f}-{r['g_high']:<4.1f}"
            lines.append(f"{r['denom']:>2} {g} {r['images']:>6} {r['median']:>7.4f} {r['max']:>7.4f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="32:512", help="'32:512' (every size), '32:512:8' or '64,112,224'")
    parser.add_argument("--images", type=int, default=48, help="generated ImageNet-sized JPEGs")
    parser.add_argument("--large", type=int, default=12, help="camera-sized renders (1024-2592 px)")
    parser.add_argument("--bicubic", action="store_true", help="also measure bicubic interpolation")
    parser.add_argument("--speed", action="store_true", help="also time the DCT shortcut per size")
    parser.add_argument("--speed-rounds", type=int, default=3)
    parser.add_argument("--residual", action="store_true", help="also tabulate the error by the shrink left after 1/d")
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 sizes, 6 + 2 images")
    parser.add_argument("--out", default=None, help="folder for results.json and table.txt")
    args = parser.parse_args(argv)
    sizes = parse_sizes(args.sizes)
    command = ["python -m bench.fidelity", *list(sys.argv[1:] if argv is None else argv)]
    if args.quick:
        sizes, args.images, args.large, args.speed_rounds = [32, 112, 224], 4, 1, 1
    report = run(
        sizes,
        images=args.images,
        large=args.large,
        interpolations=("bilinear", "bicubic") if args.bicubic else ("bilinear",),
        with_speed=args.speed,
        speed_rounds=args.speed_rounds,
        residual=args.residual,
        argv=command,
    )
    text = format_report(report)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(report, f, indent=1)
        with open(os.path.join(args.out, "table.txt"), "w") as f:
            f.write(text + "\n")
    return 0 if all(r["within"] for r in report["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
