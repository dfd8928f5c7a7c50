"""The training half of an MXNet image-classification script (``mx.mod.Module.fit``), as MXNet's example.

Written for fastload's tests after MXNet 1.9.1's ``example/image-classification/common/fit.py``: a
kvstore, ``mx.io.ResizeIter`` around the training iterator under ``dist_sync`` (so every worker runs
the same number of batches), a Module on the chosen contexts, SGD with momentum, a Speedometer. The
machine has no GPU, so ``--cpus 0,1`` lists ``mx.cpu(i)`` contexts where the example's ``--gpus``
lists GPUs.
"""

import json
import logging
import math
import time

import mxnet as mx


def add_fit_args(parser):
    train = parser.add_argument_group("Training", "model training")
    train.add_argument("--cpus", type=str, default="0", help="cpu contexts to train on, e.g. 0,1")
    train.add_argument("--kv-store", type=str, default="device")
    train.add_argument("--num-epochs", type=int, default=1)
    train.add_argument("--lr", type=float, default=0.1)
    train.add_argument("--mom", type=float, default=0.9)
    train.add_argument("--wd", type=float, default=0.0001)
    train.add_argument("--batch-size", type=int, default=128)
    train.add_argument("--disp-batches", type=int, default=20)
    train.add_argument("--result-json", type=str, default="", help="write the final scores here")
    train.add_argument("--bench", type=str, default="",
                       help="time two passes of the training iterator (the second) and one epoch of fit; write here")
    return train


def _bench(args, train, model, kv, fit_kwargs):
    """The iterator alone twice (the first pass warms the page cache and the decoders), then one epoch of fit."""
    for _ in range(2):
        train.reset()
        t0, loader_n = time.perf_counter(), 0
        for batch in train:
            loader_n += batch.data[0].shape[0] - batch.pad
        loader_s = time.perf_counter() - t0
    train.reset()
    t0 = time.perf_counter()
    model.fit(train, num_epoch=1, kvstore=kv, **fit_kwargs)
    epoch_s = time.perf_counter() - t0
    with open(args.bench, "w") as fh:
        json.dump({"loader_images": loader_n, "loader_seconds": loader_s, "epoch_images": loader_n,
                   "epoch_seconds": epoch_s, "loader": f"{type(train).__module__}.{type(train).__name__}",
                   "warnings": []}, fh)


def epoch_size(args, kv):
    return math.ceil(int(args.num_examples / kv.num_workers) / args.batch_size)


def fit(args, network, data_loader):
    kv = mx.kvstore.create(args.kv_store)
    logging.basicConfig(level=logging.INFO, format="%(asctime)-15s Node[" + str(kv.rank) + "] %(message)s")
    train, val = data_loader(args, kv)
    if "dist" in args.kv_store and "async" not in args.kv_store:
        # Equal batch counts on every worker, or dist_sync waits forever at the end of an epoch.
        logging.info("Resizing training data to %d batches per machine", epoch_size(args, kv))
        train = mx.io.ResizeIter(train, epoch_size(args, kv))
    devs = [mx.cpu(int(i)) for i in args.cpus.split(",")]
    model = mx.mod.Module(context=devs, symbol=network)
    fit_kwargs = dict(optimizer="sgd", optimizer_params={"learning_rate": args.lr, "wd": args.wd, "momentum": args.mom},
                      initializer=mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2),
                      batch_end_callback=[mx.callback.Speedometer(args.batch_size, args.disp_batches)],
                      allow_missing=True)
    if args.bench:
        _bench(args, train, model, kv, fit_kwargs)
        return model
    model.fit(train, num_epoch=args.num_epochs, eval_data=val, eval_metric=["accuracy"], kvstore=kv, **fit_kwargs)
    scores = dict(model.score(val, "acc")) if val is not None else {}
    if args.result_json:
        with open(args.result_json + (f".{kv.rank}" if kv.num_workers > 1 else ""), "w") as fh:
            json.dump({"rank": kv.rank, "workers": kv.num_workers, "val_accuracy": scores.get("accuracy"),
                       "iterator": args.iterator}, fh)
    return model
