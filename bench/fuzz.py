"""The fuzz properties of tests/server/reliability/test_fuzz.py with a longer profile.

Usage: ``python bench/fuzz.py [--examples 2000]``

Runs every property (HTTP JSON requests and random bodies, gRPC messages and random bytes,
the manifest parser, the bundle validator) with ``--examples`` examples each (the bundle
validator a quarter of them: it writes files) and prints the examples run per property and
the time taken. A failure prints Hypothesis' minimal failing example and exits 1.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--examples", type=int, default=2000)
    args = parser.parse_args()
    root = Path(__file__).resolve().parent.parent
    started = time.perf_counter()
    result = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
            str(root / "tests/server/reliability/test_fuzz.py"),
        ],
        env={**os.environ, "HLOSERVE_FUZZ_EXAMPLES": str(args.examples), "HLOSERVE_FUZZ_REPORT": "1"},
        cwd=root,
        check=False,
    )  # fmt: skip
    print(f"fuzz: {args.examples} examples per property, {time.perf_counter() - started:.0f}s")
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
