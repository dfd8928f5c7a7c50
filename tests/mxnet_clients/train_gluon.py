"""A GluonCV-style training loop over ImageRecordIter (``--use-rec``): batch_fn with split_and_load.

After GluonCV's scripts/classification/imagenet/train_imagenet.py: the training iterator with its
ImageNet recipe (random resized crop, mirror, ``brightness``/``contrast``/``saturation`` 0.4,
``pca_noise`` 0.1, mean/std), the validation iterator with ``resize`` and a centre crop, each batch
split over the contexts with ``gluon.utils.split_and_load``. ``--no-color`` leaves the colour
jitter at its defaults; ``--iterator fastload`` swaps the iterator class. With ``--bench OUT.json``
it times instead: two passes of the training iterator alone (the second timed) and one training
epoch (``bench/clients.py``).
"""

import argparse
import json
import math
import time

import mxnet as mx
from mxnet import autograd, gluon


def get_data_rec(args, ctx):
    if args.iterator == "fastload":
        import fastload.mxnet
        ImageRecordIter = fastload.mxnet.ImageRecordIter
    else:
        ImageRecordIter = mx.io.ImageRecordIter
    jitter, lighting = (0.0, 0.0) if args.no_color else (0.4, 0.1)
    resize = int(math.ceil(args.input_size / 0.875))
    mean_rgb, std_rgb = [123.68, 116.779, 103.939], [58.393, 57.12, 57.375]

    def batch_fn(batch, ctx):
        data = gluon.utils.split_and_load(batch.data[0], ctx_list=ctx, batch_axis=0)
        label = gluon.utils.split_and_load(batch.label[0], ctx_list=ctx, batch_axis=0)
        return data, label

    shape = (3, args.input_size, args.input_size)
    train = ImageRecordIter(path_imgrec=args.rec_train, path_imgidx=args.rec_train_idx,
                            preprocess_threads=args.num_workers, shuffle=True, batch_size=args.batch_size,
                            data_shape=shape, mean_r=mean_rgb[0], mean_g=mean_rgb[1], mean_b=mean_rgb[2],
                            std_r=std_rgb[0], std_g=std_rgb[1], std_b=std_rgb[2], rand_mirror=True,
                            random_resized_crop=True, max_aspect_ratio=4.0 / 3.0, min_aspect_ratio=3.0 / 4.0,
                            max_random_area=1, min_random_area=0.08, brightness=jitter, saturation=jitter,
                            contrast=jitter, pca_noise=lighting)
    val = ImageRecordIter(path_imgrec=args.rec_val, path_imgidx=args.rec_val_idx, preprocess_threads=args.num_workers,
                          shuffle=False, batch_size=args.batch_size, resize=resize, data_shape=shape,
                          mean_r=mean_rgb[0], mean_g=mean_rgb[1], mean_b=mean_rgb[2], std_r=std_rgb[0],
                          std_g=std_rgb[1], std_b=std_rgb[2])
    return train, val, batch_fn


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--rec-train", required=True)
    parser.add_argument("--rec-train-idx", default="")
    parser.add_argument("--rec-val", required=True)
    parser.add_argument("--rec-val-idx", default="")
    parser.add_argument("--iterator", choices=("mxnet", "fastload"), default="mxnet")
    parser.add_argument("--input-size", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=12)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--num-epochs", type=int, default=3)
    parser.add_argument("--classes", type=int, default=3)
    parser.add_argument("--cpus", default="0,1")
    parser.add_argument("--no-color", action="store_true")
    parser.add_argument("--result-json", default="")
    parser.add_argument("--bench", default="", help="time the iterator and one epoch, write them here")
    args = parser.parse_args(argv)
    ctx = [mx.cpu(int(i)) for i in args.cpus.split(",")]
    train_data, val_data, batch_fn = get_data_rec(args, ctx)
    net = gluon.nn.HybridSequential()
    if args.input_size > 32:  # large inputs are pooled to about 32 x 32 first: the network stays tiny at any size
        net.add(gluon.nn.AvgPool2D(pool_size=args.input_size // 32))
    net.add(gluon.nn.Conv2D(8, 3, activation="relu"), gluon.nn.GlobalAvgPool2D(), gluon.nn.Dense(args.classes))
    net.initialize(mx.init.Xavier(), ctx=ctx)
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.2, "momentum": 0.9})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    train_metric = mx.metric.Accuracy()

    def train_one_epoch():
        train_data.reset()
        train_metric.reset()
        n = 0
        for batch in train_data:
            data, label = batch_fn(batch, ctx)
            with autograd.record():
                outputs = [net(x) for x in data]
                losses = [loss_fn(o, y) for o, y in zip(outputs, label)]
            for loss in losses:
                loss.backward()
            trainer.step(args.batch_size)
            train_metric.update(label, outputs)
            n += batch.data[0].shape[0] - batch.pad
        return n

    if args.bench:
        for _ in range(2):  # the first pass warms the page cache and the decoders
            train_data.reset()
            t0, loader_n = time.perf_counter(), 0
            for batch in train_data:
                loader_n += batch.data[0].shape[0] - batch.pad
            loader_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        epoch_n = train_one_epoch()
        epoch_s = time.perf_counter() - t0
        with open(args.bench, "w") as fh:
            json.dump({"loader_images": loader_n, "loader_seconds": loader_s, "epoch_images": epoch_n,
                       "epoch_seconds": epoch_s, "loader": f"{type(train_data).__module__}.{type(train_data).__name__}",
                       "warnings": []}, fh)
        return
    for _ in range(args.num_epochs):
        train_one_epoch()
    val_metric = mx.metric.Accuracy()
    val_data.reset()
    for batch in val_data:
        data, label = batch_fn(batch, ctx)
        val_metric.update(label, [net(x) for x in data])
    result = {"train_accuracy": train_metric.get()[1], "val_accuracy": val_metric.get()[1], "iterator": args.iterator}
    if args.result_json:
        with open(args.result_json, "w") as fh:
            json.dump(result, fh)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
