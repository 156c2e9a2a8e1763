"""How long an outage of an S3 store takes to surface: `open_dataset` of a dataset whose S3
server (moto, as the tests run it) has been stopped, for RetryPolicy(attempts=1) and the default
5 attempts, each timed `--runs` times.

Usage:
    python tools/bench_outage.py --runs 3
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from remote_servers import moto_server, s3_options  # noqa: E402

from shardfmt import RemoteOptions, RetryPolicy, open_dataset  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # the retries' log lines
    with moto_server() as endpoint:
        pass  # started and stopped: nothing listens on its port any more
    for attempts in (1, 5):
        times, outcome = [], ""
        for _ in range(args.runs):
            started = time.monotonic()
            try:
                open_dataset(
                    "s3://data/ds", remote=RemoteOptions(storage_options=s3_options(endpoint), retry=RetryPolicy(attempts=attempts))
                )
            except Exception as err:
                outcome = type(err).__name__
            times.append(time.monotonic() - started)
        print(f"attempts={attempts}: {outcome} after {', '.join(f'{t:.1f}' for t in times)} s", flush=True)


if __name__ == "__main__":
    main()
