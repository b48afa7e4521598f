"""How often Airflow's scheduler hangs on SIGTERM: its own signal handler, in a process that logs through
Airflow's logging set-up as a busy scheduler does, sent SIGTERM at a random moment.

The handler (``SchedulerJobRunner._exit_gracefully``) logs before it exits. Airflow's structlog output holds a
non-reentrant lock while it writes, so a signal that lands inside a write makes the handler wait on the lock
the interrupted write holds, for ever. Run it after an Airflow upgrade: ``hung=0`` over many trials means
the stop timeout of a deployment (README, "Stopping and restarting components") is no longer what ends it.

Usage: python bench/sigterm_hang.py [--trials 50] [--patience 10] [--smoke]
Last line: sigterm_hang trials=<n> hung=<k> rate=<k/n>   (hung: still alive <patience> s after SIGTERM)
"""

from __future__ import annotations

import argparse
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import parse_args

SMOKE = {"trials": 2}

# The child: the scheduler's real handler on SIGTERM, the main thread logging as the scheduling loop does.
CHILD = """
import functools, signal
from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
from airflow.utils.log.logging_mixin import LoggingMixin

class Runner(LoggingMixin):
    _enable_tracemalloc = False

runner = Runner()
signal.signal(signal.SIGTERM, functools.partial(SchedulerJobRunner._exit_gracefully, runner))
print("ready", flush=True)
event = 0
while True:
    runner.log.info("Received executor event with state queued for task instance %s", event)
    event += 1
"""


def trial(log: Path, patience_s: float) -> bool:
    """One SIGTERM at a random moment of the logging loop; True when the process is still alive after it."""
    with log.open("wb") as output:
        child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while b"ready" not in log.read_bytes():
            if child.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the logging child did not start (exit {child.returncode}); see {log}")
            time.sleep(0.05)
        time.sleep(random.uniform(0.05, 0.3))
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=patience_s)
            return False
        except subprocess.TimeoutExpired:
            return True
    finally:
        child.kill()
        child.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--patience", type=float, default=10.0, help="seconds a stopping process may take")
    args = parse_args(parser, SMOKE)
    with tempfile.TemporaryDirectory() as folder:
        hung = sum(trial(Path(folder) / "child.log", args.patience) for _ in range(args.trials))
    print(f"sigterm_hang trials={args.trials} hung={hung} rate={hung / args.trials:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
