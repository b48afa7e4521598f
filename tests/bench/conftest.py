"""Running a bench script the way a person does, in its small mode, and reading its last line."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
# A generous cap on one smoke run; the slowest (an Airflow DAG run) takes minutes on a busy 2-core machine.
SMOKE_CAP_S = 540


def load_bench_common():
    # bench/_common.py by path: bench/ is not a package, and the scripts import it from their own folder
    spec = importlib.util.spec_from_file_location("fleetgen_bench_common", BENCH / "_common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def bench_common():
    return load_bench_common()


@pytest.fixture(scope="session")
def bench_folder() -> Path:
    return BENCH


def bench_environment() -> dict[str, str]:
    """This environment without what the suite sets for its own Airflow (tests/conftest.py): a bench run from
    a shell has none of it. The worker's port range stays."""
    return {key: value for key, value in os.environ.items()
            if not key.startswith(("AIRFLOW", "FLEETGEN_")) or key == "FLEETGEN_PORT_RANGE"}


@pytest.fixture
def run_bench(tmp_path, bench_common):
    """``run_bench(name, *args, words=())``: bench/<name>.py --smoke *args in a scratch folder; its figures, each a
    list of finite numbers (one per ``/`` part) or, for a key in ``words``, its text, after checking it exited 0 and
    its last line names it."""
    common = bench_common

    def run(name: str, *args: str, words: tuple[str, ...] = ()) -> dict[str, list[float] | str]:
        command = [sys.executable, str(BENCH / f"{name}.py"), common.SMOKE_FLAG, *args]
        try:
            result = subprocess.run(command, cwd=tmp_path, env=bench_environment(), capture_output=True, text=True,
                                    timeout=SMOKE_CAP_S)
        except subprocess.TimeoutExpired as expired:
            tail = [text.decode(errors="replace") if isinstance(text, bytes) else text or ""
                    for text in (expired.stdout, expired.stderr)]
            pytest.fail(f"{name} --smoke still running after {SMOKE_CAP_S} s; last output:\n"
                        f"stdout ...{tail[0][-3000:]}\nstderr ...{tail[1][-3000:]}")
        seen = f"stdout ...{result.stdout[-3000:]}\nstderr ...{result.stderr[-3000:]}"
        assert result.returncode == 0, f"{name} --smoke exited {result.returncode}\n{seen}"
        try:
            bench_name, figures = common.read_last_line(result.stdout, words)
        except ValueError as error:
            pytest.fail(f"{name}: the last line is not machine-readable ({error})\n{seen}")
        assert bench_name == name, seen
        assert figures and set(words) <= set(figures), seen
        assert all(math.isfinite(part) for key, parts in figures.items() if key not in words for part in parts), seen
        return figures

    return run
