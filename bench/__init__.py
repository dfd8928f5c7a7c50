"""Measurement stage: ``fastload bench``, one harness for every benchmark of the project.

Installed as the package ``fastload_bench`` (setup.py maps it onto ``bench/``); the CLI registers
:func:`fastload_bench.command.add_parser`. Module map: ``harness`` (interleaved timing, results),
``prepare`` (the dataset in every form), ``stages`` (fastload's stages alone and together, decode
references), ``peers/`` (other loaders, each in its own process), ``pack_bench`` (pack vs im2rec),
``model_step`` (input-bound verdict), ``targets`` (issue targets), ``report`` (table, JSON, plot).
"""
