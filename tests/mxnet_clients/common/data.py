"""The data half of an MXNet image-classification training script, as MXNet's example writes it.

Written for fastload's tests after MXNet 1.9.1's ``example/image-classification/common/data.py``:
the same command-line arguments with the same defaults, the same ``ImageRecordIter`` calls with
every argument that file passes, the augmentation presets of its older ``--aug-level`` and of
1.9.1's ``--use-imagenet-data-augmentation``. The one change a user makes to try fastload is the
iterator class, here chosen by ``--iterator`` (``mxnet`` or ``fastload``).
"""

import mxnet as mx


def iterator_class(name):
    """``mx.io.ImageRecordIter`` or ``fastload.mxnet.ImageRecordIter``: the only difference between runs."""
    if name == "fastload":
        import fastload.mxnet
        return fastload.mxnet.ImageRecordIter
    return mx.io.ImageRecordIter


def add_data_args(parser):
    data = parser.add_argument_group("Data", "the input images")
    data.add_argument("--data-train", type=str, help="the training data (.rec)")
    data.add_argument("--data-train-idx", type=str, default="", help="its index")
    data.add_argument("--data-val", type=str, help="the validation data (.rec)")
    data.add_argument("--data-val-idx", type=str, default="", help="its index")
    data.add_argument("--rgb-mean", type=str, default="123.68,116.779,103.939", help="mean of each channel")
    data.add_argument("--rgb-std", type=str, default="1,1,1", help="standard deviation of each channel")
    data.add_argument("--pad-size", type=int, default=0, help="pixels of padding on each side")
    data.add_argument("--fill-value", type=int, default=127, help="value of the padding pixels")
    data.add_argument("--image-shape", type=str, help="the network's input, e.g. 3,224,224")
    data.add_argument("--num-classes", type=int, help="number of classes")
    data.add_argument("--num-examples", type=int, help="number of training images")
    data.add_argument("--data-nthreads", type=int, default=4, help="decoding threads")
    data.add_argument("--iterator", choices=("mxnet", "fastload"), default="mxnet",
                      help="which ImageRecordIter class reads the data")
    return data


def add_data_aug_args(parser):
    aug = parser.add_argument_group("Image augmentations", "MXNet's default augmenter")
    aug.add_argument("--random-crop", type=int, default=0)
    aug.add_argument("--random-mirror", type=int, default=0)
    aug.add_argument("--max-random-h", type=int, default=0)
    aug.add_argument("--max-random-s", type=int, default=0)
    aug.add_argument("--max-random-l", type=int, default=0)
    aug.add_argument("--min-random-aspect-ratio", type=float, default=None)
    aug.add_argument("--max-random-aspect-ratio", type=float, default=0)
    aug.add_argument("--max-random-rotate-angle", type=int, default=0)
    aug.add_argument("--max-random-shear-ratio", type=float, default=0)
    aug.add_argument("--max-random-scale", type=float, default=1)
    aug.add_argument("--min-random-scale", type=float, default=1)
    aug.add_argument("--max-random-area", type=float, default=1)
    aug.add_argument("--min-random-area", type=float, default=1)
    aug.add_argument("--min-crop-size", type=int, default=-1)
    aug.add_argument("--max-crop-size", type=int, default=-1)
    aug.add_argument("--brightness", type=float, default=0)
    aug.add_argument("--contrast", type=float, default=0)
    aug.add_argument("--saturation", type=float, default=0)
    aug.add_argument("--pca-noise", type=float, default=0)
    aug.add_argument("--random-resized-crop", type=int, default=0)
    aug.add_argument("--aug-level", type=int, default=0, choices=(0, 1, 2, 3),
                     help="augmentation preset: 1 crop + mirror, 2 also HSL jitter, 3 also rotation, shear, aspect")
    aug.add_argument("--use-imagenet-data-augmentation", type=int, default=0,
                     help="the standard ImageNet recipe (random resized crop, colour jitter, PCA noise)")
    return aug


def apply_aug_presets(parser, argv):
    """Set the defaults of the chosen presets, then parse ``argv`` again (explicit flags win)."""
    args = parser.parse_args(argv)
    level = args.aug_level
    if level >= 1:
        parser.set_defaults(random_crop=1, random_mirror=1)
    if level >= 2:
        parser.set_defaults(max_random_h=36, max_random_s=50, max_random_l=50)
    if level >= 3:
        parser.set_defaults(max_random_rotate_angle=10, max_random_shear_ratio=0.1, max_random_aspect_ratio=0.25)
    if args.use_imagenet_data_augmentation:
        parser.set_defaults(rgb_mean="123.68,116.779,103.939", rgb_std="58.393,57.12,57.375", random_crop=0,
                            random_resized_crop=1, random_mirror=1, min_random_area=0.08,
                            max_random_aspect_ratio=4.0 / 3.0, min_random_aspect_ratio=3.0 / 4.0, brightness=0.4,
                            contrast=0.4, saturation=0.4, pca_noise=0.1)
    return parser.parse_args(argv)


def train_iter_kwargs(args, rank=0, nworker=1):
    """Every argument MXNet's example passes to the training ImageRecordIter."""
    image_shape = tuple(int(x) for x in args.image_shape.split(","))
    mean = [float(x) for x in args.rgb_mean.split(",")]
    std = [float(x) for x in args.rgb_std.split(",")]
    return dict(
        path_imgrec=args.data_train, path_imgidx=args.data_train_idx, label_width=1,
        mean_r=mean[0], mean_g=mean[1], mean_b=mean[2], std_r=std[0], std_g=std[1], std_b=std[2],
        data_name="data", label_name="softmax_label", data_shape=image_shape, batch_size=args.batch_size,
        rand_crop=args.random_crop, max_random_scale=args.max_random_scale, pad=args.pad_size,
        fill_value=args.fill_value, random_resized_crop=args.random_resized_crop,
        min_random_scale=args.min_random_scale, max_aspect_ratio=args.max_random_aspect_ratio,
        min_aspect_ratio=args.min_random_aspect_ratio, max_random_area=args.max_random_area,
        min_random_area=args.min_random_area, min_crop_size=args.min_crop_size, max_crop_size=args.max_crop_size,
        brightness=args.brightness, contrast=args.contrast, saturation=args.saturation, pca_noise=args.pca_noise,
        random_h=args.max_random_h, random_s=args.max_random_s, random_l=args.max_random_l,
        max_rotate_angle=args.max_random_rotate_angle, max_shear_ratio=args.max_random_shear_ratio,
        rand_mirror=args.random_mirror, preprocess_threads=args.data_nthreads, shuffle=True,
        num_parts=nworker, part_index=rank)


def val_iter_kwargs(args, rank=0, nworker=1):
    """Every argument MXNet's example passes to the validation ImageRecordIter."""
    image_shape = tuple(int(x) for x in args.image_shape.split(","))
    mean = [float(x) for x in args.rgb_mean.split(",")]
    std = [float(x) for x in args.rgb_std.split(",")]
    return dict(
        path_imgrec=args.data_val, path_imgidx=args.data_val_idx, label_width=1,
        mean_r=mean[0], mean_g=mean[1], mean_b=mean[2], std_r=std[0], std_g=std[1], std_b=std[2],
        data_name="data", label_name="softmax_label", batch_size=args.batch_size, data_shape=image_shape,
        preprocess_threads=args.data_nthreads, rand_crop=False, rand_mirror=False, num_parts=nworker,
        part_index=rank)


def get_rec_iter(args, kv=None):
    rank, nworker = (kv.rank, kv.num_workers) if kv else (0, 1)
    cls = iterator_class(args.iterator)
    train = cls(**train_iter_kwargs(args, rank, nworker))
    if args.data_val is None:
        return train, None
    return train, cls(**val_iter_kwargs(args, rank, nworker))
