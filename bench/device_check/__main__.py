"""``python -m bench.device_check``: see :mod:`bench.device_check.driver`."""

import sys

from bench.device_check.driver import main

sys.exit(main())
