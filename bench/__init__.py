"""Benchmarks: ``fastload bench``, one harness for every benchmark of the project.

The top-level package ``bench`` of a source checkout (not part of the wheel); ``fastload bench``
registers :func:`bench.command.add_parser` (see :mod:`fastload.cli.bench`). Module map: ``harness``
(interleaved timing, results), ``prepare`` (the dataset in every form), ``stages`` (fastload's
stages alone and together, decode references), ``peers/`` (other loaders, each in its own process),
``pack_bench`` (pack vs im2rec), ``model_step`` (input-bound verdict), ``targets`` (the performance
targets), ``report`` (table, JSON, plot); cold epochs from a slow disk: ``slow_device`` (the throttled
loop device), ``slow_disk`` (the benchmark), ``cold_contenders``, ``order_mixing`` (each order's
randomness), ``slow_disk_report``.
"""
