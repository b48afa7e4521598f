"""The real SGLang 0.5.23 server's own start-up failures, read the way the readiness wait reads them.

Each test launches a real server that fails, then classifies its log with ``fleetgen.nodes.readiness.find_fatal``
over the last ``LOG_TAIL_LINES`` lines, as the readiness trigger does (include/fleetgen/airflow/triggers.py),
and over the whole log: both must name the same kind and the line that says the cause, not a traceback header
or the launcher's kill lines that follow it, and the kind's hint must say what to change.
docs/sglang-memory-model.md §5.2 lists the lines.

A scheduler that raises logs its traceback, then the launcher logs "Received sigquit from a child process" and
SIGKILLs its own process tree (exit -9); a failure in the launcher itself exits 1, argparse exits 2.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest

from fleetgen.airflow.triggers import LOG_TAIL_LINES
from fleetgen.errors import FailureKind
from fleetgen.nodes import readiness
from tests.real_sglang import server as real

# What each hint must name for the on-call engineer to act: a DAG parameter or a fleet-description key.
HINT_NAMES = {FailureKind.BAD_ARGS: "server.extra_args", FailureKind.PORT_IN_USE: "base_port",
              FailureKind.OOM_KV: "max_running_requests", FailureKind.OOM_WEIGHTS: "memory_margin_mib"}


def _port() -> int:
    from devstack.demo import free_port_block

    return free_port_block(1)


READY_MARK = "The server is fired up and ready to roll!"  # SGLang's log line once it serves
# SGLang's weight-loading line when the host's free memory grew meanwhile (model_executor/model_runner.py).
MEMORY_GREW = re.compile(r"Load weight end\\..* mem usage=-")


class StartedAnyway(AssertionError):
    """A server expected to fail at start-up became ready."""

    def __init__(self, server: real.RealServer) -> None:
        super().__init__(f"{server.log_path}: the server on port {server.port} did not fail while starting; its "
                         f"log ends:\n{server.log_tail()}")
        self.lines = server.log_text().splitlines()


def _exit_status(server: real.RealServer, timeout_s: float = 240.0) -> int:
    """The exit status of a server expected to fail at start-up; ``StartedAnyway`` as soon as it is ready."""
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            code = server.process.poll()
            if code is not None:
                return code
            if READY_MARK in server.log_text():
                raise StartedAnyway(server)
            time.sleep(0.5)
        raise StartedAnyway(server)
    finally:
        server.stop()


def _failed_start(tmp_path: Path, model_dir: Path, *flags: str, kv_tokens: int | None = real.KV_TOKENS,
                  expected_exit: int) -> list[str]:
    """The log lines of a server that exits by itself while starting."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    server = real.RealServer(model_dir=model_dir, port=_port(), log_path=tmp_path / "server.log", flags=flags,
                             kv_tokens=kv_tokens).start()
    code = _exit_status(server)
    assert code == expected_exit, f"{server.log_path}: exit {code}, not {expected_exit}:\n{server.log_tail()}"
    return server.log_text().splitlines()


def _classified(lines: list[str], kind: FailureKind, cause: str) -> readiness.FatalLine:
    """The verdict of the readiness wait on this log: the same from its tail and from the whole log."""
    excerpt = readiness.format_log_excerpt(lines, limit=15)
    fatal = readiness.find_fatal(lines[-LOG_TAIL_LINES:])
    assert fatal is not None, f"no fatal line in the last {LOG_TAIL_LINES} lines:\n{excerpt}"
    whole = readiness.find_fatal(lines)
    assert (whole.kind, whole.line) == (fatal.kind, fatal.line), excerpt
    assert fatal.kind is kind, f"{fatal.kind.value} from {fatal.line!r}"
    assert cause in fatal.line, f"{fatal.line!r} is not the cause:\n{excerpt}"
    assert not fatal.line.startswith("Traceback") and "Received sigquit" not in fatal.line
    if kind in HINT_NAMES:
        assert HINT_NAMES[kind] in fatal.hint, fatal.hint
    return fatal


def test_an_unknown_flag_is_bad_args(tmp_path, tiny_models):
    lines = _failed_start(tmp_path, tiny_models["dense"], "--no-such-flag", "1", expected_exit=2)
    fatal = _classified(lines, FailureKind.BAD_ARGS, "error: unrecognized arguments: --no-such-flag 1")
    assert fatal.line == "sglang serve: error: unrecognized arguments: --no-such-flag 1"


def test_a_context_longer_than_the_models_is_bad_args(tmp_path, tiny_models):
    # sglang/srt/configs/model_config.py refuses it unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN is set
    lines = _failed_start(tmp_path, tiny_models["dense"], "--context-length", "4096", expected_exit=1)
    fatal = _classified(lines, FailureKind.BAD_ARGS, "User-specified context_length (4096) is greater than the "
                                                     "derived context_length (2048)")
    assert fatal.line.startswith("ValueError: Warning: User-specified context_length")


def test_a_port_in_use_fails_on_uvicorns_line_whether_or_not_the_server_exits(tmp_path, tiny_models,
                                                                              real_dense_server):
    """uvicorn binds the port only after the model loaded and logs the bind error; SGLang then sometimes waits in
    the application shutdown instead of exiting, sometimes exits: the wait fails on the line, not on an exit."""
    server = real.RealServer(model_dir=tiny_models["dense"], port=real_dense_server.port,
                             log_path=tmp_path / "server.log").start()
    try:
        deadline = time.monotonic() + 240
        fatal = None
        while fatal is None and time.monotonic() < deadline:
            time.sleep(0.5)
            fatal = readiness.find_fatal(server.log_text().splitlines()[-LOG_TAIL_LINES:])
            if fatal is None and server.process.poll() is not None:  # exited: its whole log is written
                fatal = readiness.find_fatal(server.log_text().splitlines()[-LOG_TAIL_LINES:])
                break
        assert fatal is not None, f"{server.log_path}: no fatal line:\n{server.log_tail()}"
        lines = server.log_text().splitlines()
    finally:
        server.stop()
    fatal = _classified(lines, FailureKind.PORT_IN_USE, f"{real_dense_server.port}): address already in use")
    assert "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', " in fatal.line


def test_a_model_folder_without_config_exits_with_the_exception_that_names_it(tmp_path, tiny_models):
    """No kind says "model folder" (fleetgen.errors.FailureKind): the verdict is ``exited`` with the exception
    line that ends the launcher's traceback, instead of the traceback's first line."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_models["dense"], folder)
    (folder / "config.json").unlink()
    lines = _failed_start(tmp_path, folder, expected_exit=1)
    fatal = _classified(lines, FailureKind.EXITED, str(folder))
    assert fatal.line == (f"ValueError: Unrecognized model in {folder}. "
                          "Should have a `model_type` key in its config.json.")


def test_a_pool_cap_below_one_page_is_oom_kv(tmp_path, tiny_models):
    """SGLang floors the KV pool to whole pages, and a pool of zero tokens fails
    ``MemoryPoolConfig.__post_init__`` (sglang/srt/model_executor/pool_configurator.py): the check a budget too
    small for one page fails on a GPU. On CPU the budget is the host's free RAM, so the cap is what runs short."""
    lines = _failed_start(tmp_path, tiny_models["dense"], "--page-size", "64", kv_tokens=32, expected_exit=-9)
    fatal = _classified(lines, FailureKind.OOM_KV, "Not enough memory. Please try to increase --mem-fraction-static.")
    assert fatal.line == "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."


def test_a_static_fraction_below_the_weights_is_oom_weights(tmp_path, tiny_models):
    """The KV budget is free memory minus ``pre_load * (1 - mem_fraction_static)``
    (sglang/srt/mem_cache/kv_cache_configurator.py::_profile_available_bytes), free memory being the host's on
    CPU (``get_free_cpu_memory``: the machine's available memory, or its cgroup's room). With a fraction of 1e-5
    the server fails unless the host's free memory *grew* while its weights loaded, as it does when other tests'
    processes end beside it (seen with three test workers, whatever the weights' size). SGLang logs
    that growth as a negative ``mem usage`` on its ``Load weight end`` line; only then is the start tried again."""
    for attempt in range(3):
        try:
            lines = _failed_start(tmp_path / f"try{attempt}", tiny_models["dense"], "--mem-fraction-static", "0.00001",
                                  "--json-model-override-args", '{"vocab_size": 4194304}', expected_exit=-9)
            break
        except StartedAnyway as started:
            if not any(MEMORY_GREW.search(line) for line in started.lines):
                raise
    else:
        pytest.fail("the host's free memory grew during each of three loads: no start could fail", pytrace=False)
    fatal = _classified(lines, FailureKind.OOM_WEIGHTS, "Loaded weights leave no GPU memory for the KV cache under "
                                                        "--mem-fraction-static=1e-05.")
    assert fatal.line.startswith("ValueError: ")
