"""Fixtures for the tests against the real SGLang 0.5.23 server on CPU (marker ``real_sglang``).

Each server starts once per test session (about 30 s each on two cores) and is stopped with SIGTERM at the end.
Without the server venv the tests are skipped with what to run; under CI (CI=true) that is a failure.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.real_sglang import server as real


def pytest_configure(config):
    config.addinivalue_line("markers", "stops_real_server: SIGTERMs the session's real servers; runs last")


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixture parameters
def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.real_sglang)
            item.add_marker(pytest.mark.slow)
    # a test that stops a session server goes after every test that may still use it
    items.sort(key=lambda item: item.get_closest_marker("stops_real_server") is not None)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    real.require_real_sglang()
    return real.write_tiny_models(tmp_path_factory.mktemp("tiny-models"))


def _free_port() -> int:
    from devstack.demo import free_port_block

    return free_port_block(1)


@pytest.fixture(scope="session")
def real_dense_server(tiny_models, tmp_path_factory):
    """A real dense server (LlamaForCausalLM, random weights), ready."""
    with real.RealServer(model_dir=tiny_models["dense"], port=_free_port(),
                         log_path=tmp_path_factory.mktemp("real-dense") / "server.log") as server:
        yield server


@pytest.fixture(scope="session")
def real_hybrid_server(tiny_models, tmp_path_factory):
    """A real hybrid server (Qwen3NextForCausalLM: Gated DeltaNet + full attention + MoE, random weights), ready.

    A 16-slot Mamba state pool; SGLang caps the 8 running requests asked for to what the pool holds.
    """
    with real.RealServer(model_dir=tiny_models["hybrid"], port=_free_port(),
                         log_path=tmp_path_factory.mktemp("real-hybrid") / "server.log",
                         flags=(*real.HYBRID_FLAGS, "--max-mamba-cache-size", "16", "--max-running-requests", "8")
                         ) as server:
        yield server
