"""``python -m bench``: run the benchmark suite (``--help`` for the options)."""

import sys

from bench.runner import main

sys.exit(main())
