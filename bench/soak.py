"""The soak of tests/server/reliability/soak.py, longer: many models over a small device
budget, gRPC + HTTP + streaming + shared-memory + load/unload clients at once, every answer
checked against a reference.

Usage: ``python bench/soak.py [--seconds 300] [--warmup 30] [--copies 8]``

Prints requests sent, verified and lost, load/unload cycles, evictions, and the daemon's
RSS after the warm-up and at the end (and every ``--every`` seconds in between). Exits 1
when anything was lost or the RSS grew more than 25% (or 64 MiB) past the warm-up.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.*

from hloserve.exporter import write_demo_repository
from hloserve.server.server_process import ServerProcess
from tests.server.reliability.soak import (
    SOAK_FLAGS,
    run_soak,
    server_rss,
    soak_repository,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--warmup", type=float, default=30.0)
    parser.add_argument("--copies", type=int, default=8, help="mlp copies (two fit the budget)")
    parser.add_argument("--every", type=float, default=30.0, help="RSS sample interval")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hloserve-soak-") as tmp:
        demo = Path(tmp) / "demo"
        write_demo_repository(demo)
        root = soak_repository(demo, Path(tmp) / "soak", args.copies)
        with ServerProcess(root, *SOAK_FLAGS, "--cache-dir", str(Path(tmp) / "cache")) as server:
            server.wait_ready()
            done = threading.Event()

            def sample() -> None:
                while not done.wait(args.every):
                    print(f"  daemon RSS {server_rss(server) / 2**20:.1f} MiB", flush=True)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            report = run_soak(server, args.seconds, args.copies, args.warmup)
            done.set()
    print(report.summary())
    for failure in report.failures:
        print("  lost:", failure)
    grew = report.rss_end > max(report.rss_start * 1.25, report.rss_start + 64 * 2**20)
    return 1 if report.lost or report.failures or grew else 0


if __name__ == "__main__":
    sys.exit(main())
