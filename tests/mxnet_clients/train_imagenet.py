"""Train an image classifier from .rec files the way MXNet's example/image-classification/train_imagenet.py does.

A tiny network stands in for ResNet so the run fits in a test. ``--iterator fastload`` swaps
``mx.io.ImageRecordIter`` for ``fastload.mxnet.ImageRecordIter``; nothing else changes.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mxnet as mx  # noqa: E402

from common import data, fit  # noqa: E402


def tiny_symbol(num_classes, size=32):
    net = mx.sym.var("data")
    if size > 32:  # large inputs are pooled to about 32 x 32 first: the network stays tiny at any size
        k = size // 32
        net = mx.sym.Pooling(net, kernel=(k, k), stride=(k, k), pool_type="avg")
    net = mx.sym.Convolution(net, kernel=(3, 3), num_filter=8, name="conv0")
    net = mx.sym.Activation(net, act_type="relu")
    net = mx.sym.Pooling(net, global_pool=True, pool_type="avg", kernel=(1, 1))
    net = mx.sym.FullyConnected(mx.sym.flatten(net), num_hidden=num_classes, name="fc")
    return mx.sym.SoftmaxOutput(net, name="softmax")


def main(argv=None):
    parser = argparse.ArgumentParser(description="train an image classifier",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    fit.add_fit_args(parser)
    data.add_data_args(parser)
    data.add_data_aug_args(parser)
    parser.set_defaults(image_shape="3,32,32", min_random_scale=1)
    args = data.apply_aug_presets(parser, argv)
    fit.fit(args, tiny_symbol(args.num_classes, int(args.image_shape.split(",")[-1])), data.get_rec_iter)


if __name__ == "__main__":
    main()
