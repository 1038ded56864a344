"""Open new ledger files at agreed moments, racing other processes.

Run as a script: ``python _first_open.py BUSY_MS JITTER SEED PATH START [PATH START ...]``.
For each path it sleeps until ``START`` (Unix seconds) plus a random jitter of
up to ``JITTER`` seconds (so the racers meet in every phase), opens the ledger
(creating it, unless another process was first), creates one task and closes
it, then prints one JSON line: the outcome (``ok`` or the exception class)
and how long the call took.
"""

from __future__ import annotations

import json
import random
import sys
import time

from taskwarden import Ledger


def main(argv: list[str]) -> int:
    busy_ms, jitter, rng = int(argv[0]), float(argv[1]), random.Random(int(argv[2]))
    pairs = list(zip(argv[3::2], argv[4::2], strict=True))
    for path, start in pairs:
        time.sleep(max(0.0, float(start) + rng.uniform(0.0, jitter) - time.time()))
        began = time.monotonic()
        try:
            with Ledger(path, busy_timeout_ms=busy_ms) as ledger:
                ledger.create_task()
            outcome = "ok"
        except Exception as exc:
            outcome = f"{type(exc).__module__}.{type(exc).__name__}"
        took = time.monotonic() - began
        print(json.dumps({"path": path, "outcome": outcome, "seconds": took}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
