"""wait_ready takes the limits of the server its launch started, not of whatever answers on the port: SGLang binds
its port only after loading the model, so until then another process there may answer /health and /server_info."""

import asyncio
from types import SimpleNamespace

from fleetgen.airflow.triggers import ReadinessTrigger

SERVER = {"node": "node0", "name": "node0:30000", "url": "http://127.0.0.1:30000", "port": 30000, "gpu_ids": [0]}
ARGS = ["--model-path", "/models/tonight", "--served-model-name", "tonight", "--host", "0.0.0.0", "--port", "30000",
        "--mem-fraction-static", "0.9", "--enable-metrics"]


def _info(**changes) -> dict:
    info = {"model_path": "/models/tonight", "served_model_name": "tonight", "host": "0.0.0.0", "port": 30000,
            "mem_fraction_static": 0.9, "enable_metrics": True, "version": "0.5.23", "internal_states": [{}]}
    return {**info, **changes}


class FakeHTTP:
    def __init__(self, server_info: dict):
        self.server_info = server_info

    async def get(self, path):
        body = {"/health": None, "/model_info": {"model_path": "x"}, "/server_info": self.server_info}[path]
        return SimpleNamespace(status_code=200, json=lambda: dict(body or {}), raise_for_status=lambda: None)


def _probe(server_info: dict, context: dict):
    trigger = ReadinessTrigger(server=SERVER, ssh_conn_id="node0", log_path="/x.log", pid=7, watch={"timeout_s": 600},
                               context=context)
    return trigger, asyncio.run(trigger._probe_http(FakeHTTP(server_info)))


def test_a_server_running_this_launch_is_ready():
    _, info = _probe(_info(), {"launched": {"args": ARGS}})
    assert info is not None and info["model_path"] == "/models/tonight"


def test_another_server_on_the_port_is_not_taken_for_this_launch():
    warnings = []
    trigger = ReadinessTrigger(server=SERVER, ssh_conn_id="node0", log_path="/x.log", pid=7, watch={"timeout_s": 600},
                               context={"launched": {"args": ARGS}})
    trigger._log = SimpleNamespace(warning=lambda message, *args: warnings.append(message % args))
    foreign = _info(model_path="/models/last-week", mem_fraction_static=0.8)
    assert asyncio.run(trigger._probe_http(FakeHTTP(foreign))) is None
    assert asyncio.run(trigger._probe_http(FakeHTTP(foreign))) is None
    # the warning names what differs, once
    assert len(warnings) == 1 and "--model-path: running '/models/last-week', tonight '/models/tonight'" in warnings[0]


def test_a_launch_record_without_arguments_is_not_checked():
    """Records written before the launch kept its arguments (a run resumed across an upgrade) are taken as they
    answer, as before."""
    _, info = _probe(_info(model_path="/elsewhere"), {"launched": {}})
    assert info is not None
