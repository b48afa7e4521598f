"""Stopping a process tree the way a deployment does: SIGTERM to every process of its session, a grace
period, then SIGKILL to whatever is left.

Airflow's components are started as session leaders; their task processes move to process groups of their
own but stay in the session, so a session, not a process group, is what belongs to a component.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

# How long a stopped component may take to exit before it is killed, as Kubernetes' default
# terminationGracePeriodSeconds. Celery's warm shutdown needs it, and Airflow 3.3's scheduler can hang for
# ever on SIGTERM: its handler logs, and a signal that lands inside a log write waits on the lock that
# write holds (README, "Stopping and restarting components").
STOP_GRACE_S = 30


def terminate_sessions(leaders: list[int], sig: int = signal.SIGTERM, grace_s: float = STOP_GRACE_S) -> list[int]:
    """Send ``sig`` to every process of each leader's session, wait up to ``grace_s`` for the leaders to
    exit, then SIGKILL whatever is left of every session. The leaders that outlived the grace."""
    for leader in leaders:
        _signal_session(leader, sig)
    deadline = time.monotonic() + grace_s
    while any(map(_running, leaders)) and time.monotonic() < deadline:
        time.sleep(0.2)
    stuck = [leader for leader in leaders if _running(leader)]
    for leader in leaders:
        _signal_session(leader, signal.SIGKILL)  # a stuck leader, and what a leader that exited left behind
    return stuck


def _signal_session(leader: int, sig: int) -> None:
    for pid in session_members(leader):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _running(pid: int) -> bool:
    """Alive and not a zombie (an exited child not yet reaped still has its /proc entry)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def session_members(session_id: int) -> list[int]:
    """The pids of every process in a session (the components are started as session leaders)."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == session_id:
                    members.append(int(entry))
            except (ProcessLookupError, PermissionError):
                continue
    return members
