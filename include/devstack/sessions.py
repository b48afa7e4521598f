"""Stopping a process tree the way a deployment does: SIGTERM to every process of its session, a grace
period, then SIGKILL to whatever is left. Holding one (SIGSTOP to every process of its session, SIGCONT to let
it go on), so that a test reads a state the tree's own work would pass by.

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
        signal_session(leader, sig)
    return reap_sessions(leaders, grace_s)


def reap_sessions(leaders: list[int], grace_s: float = STOP_GRACE_S) -> list[int]:
    """After a signal that asks them to stop: wait up to ``grace_s`` for the leaders to exit, then SIGKILL
    whatever is left of every session. The leaders that outlived the grace."""
    deadline = time.monotonic() + grace_s
    while any(map(_running, leaders)) and time.monotonic() < deadline:
        time.sleep(0.2)
    stuck = [leader for leader in leaders if _running(leader)]
    for leader in leaders:
        signal_session(leader, signal.SIGKILL)  # a stuck leader, and what a leader that exited left behind
    return stuck


def signal_session(leader: int, sig: int) -> None:
    """Send ``sig`` to every process of the leader's session; returns at once."""
    for pid in session_members(leader):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def hold_sessions(leaders: list[int], timeout_s: float = 30.0) -> None:
    """SIGSTOP every process of each leader's session and return once every one of them is stopped, a child
    forked before its parent stopped too: until ``release_sessions``, nothing they do moves on. TimeoutError
    naming the processes that were not stopped (and their states) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        moving = {pid: state for leader in leaders for pid in session_members(leader)
                  if (state := _state(pid)) not in STILL}
        if not moving:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"not stopped {timeout_s:.0f} s after SIGSTOP (pid: state): {moving}")
        for pid in moving:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        time.sleep(0.001)  # the kernel stops a process running on another core a moment after kill() returns


def release_sessions(leaders: list[int]) -> None:
    """SIGCONT every process of each leader's session (of one that exited meanwhile, nothing is left)."""
    for leader in leaders:
        signal_session(leader, signal.SIGCONT)


# /proc/PID/stat states of a process that does nothing: stopped, traced, a zombie, dead.
STILL = ("T", "t", "Z", "X", None)


def _state(pid: int) -> str | None:
    """The process's state letter (/proc/PID/stat), None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat[stat.rindex(")") + 2]


def _running(pid: int) -> bool:
    """Alive and not a zombie (an exited child not yet reaped still has its /proc entry)."""
    return _state(pid) not in ("Z", "X", None)


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
