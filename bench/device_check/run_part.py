"""Runs one part in this process: ``python -m bench.device_check.run_part NAME CONFIG.json RESULT.json``.

The driver starts one such process per part, with the part's time limit: a part that crashes, hangs
or exhausts the GPU takes only itself down. The result file is rewritten as the part goes
(:class:`~bench.device_check.measure.Recorder`), and ends with ``status`` ``ok`` or ``error`` (with
the exception and its traceback).
"""

from __future__ import annotations

import importlib
import sys
import time
import traceback

from bench.device_check import PARTS
from bench.device_check.measure import Recorder
from bench.device_check.plan import Config

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or args[0] not in PARTS:
        print(f"usage: python -m bench.device_check.run_part {{{','.join(PARTS)}}} CONFIG.json RESULT.json")
        return 2
    name, config_path, result_path = args
    config = Config.load(config_path)
    recorder = Recorder(result_path)
    t0 = time.perf_counter()
    try:
        module = importlib.import_module(f"bench.device_check.{name}")
        module.run(config, recorder)
    except BaseException as exc:
        recorder.data.update(
            status="error",
            error=f"{type(exc).__name__}: {exc}",
            traceback=traceback.format_exc()[-4000:],
            seconds=round(time.perf_counter() - t0, 2),
        )
        recorder.save()
        print(traceback.format_exc(), file=sys.stderr)
        return 1
    if recorder.data.get("status") == "running":
        recorder.data["status"] = "ok"
    recorder.data["seconds"] = round(time.perf_counter() - t0, 2)
    recorder.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
