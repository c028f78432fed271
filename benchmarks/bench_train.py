"""Training-throughput benchmark; the same as ``dynlab bench train`` (see :mod:`dynlab.bench`).

    python benchmarks/bench_train.py --quick --json bench.json
"""

from __future__ import annotations

import sys

from dynlab.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "train", *sys.argv[1:]]))
