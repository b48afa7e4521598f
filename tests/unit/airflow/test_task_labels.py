"""Labels of mapped task instances: the node, the server as host:port (GPU ids), the shard's prompt range."""

import jinja2

from fleetgen.airflow.task_labels import NODE_LABEL, SERVER_LABEL, SHARD_LABEL


class _Task:
    def __init__(self, **fields):
        self.__dict__.update(fields)


def _render(template, **task_fields):
    return jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(template).render(
        task=_Task(**task_fields))


def test_node_server_and_shard_labels():
    assert _render(NODE_LABEL, op_kwargs={"node": "gpu-node-1"}) == "gpu-node-1"
    server = {"node": "gpu-node-1", "port": 30001, "gpu_ids": [2, 3], "name": "gpu-node-1:30001"}
    assert _render(SERVER_LABEL, server=server) == "gpu-node-1:30001 (GPU 2,3)"
    shard = {"shard_id": 2, "input_path": "/p.jsonl", "start": 912, "first": 10000, "count": 5000}
    assert _render(SHARD_LABEL, op_kwargs={"shard": shard}) == "shard 2: prompts 10000-14999"


def test_shards_carry_their_first_prompt_index(tmp_path):
    import json

    from fleetgen.prompts.scan import plan_shards

    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": "hi"}) + "\n" for i in range(7)))
    shards = plan_shards(path, shard_size=3)
    assert [(s["first"], s["count"]) for s in shards] == [(0, 3), (3, 3), (6, 1)]


def test_the_first_shard_of_one_prompt_and_a_server_on_gpu_0_read_as_such():
    shard = {"shard_id": 0, "input_path": "/p.jsonl", "start": 0, "first": 0, "count": 1}
    assert _render(SHARD_LABEL, op_kwargs={"shard": shard}) == "shard 0: prompts 0-0"
    server = {"node": "n0", "port": 30000, "gpu_ids": [0], "name": "n0:30000"}
    assert _render(SERVER_LABEL, server=server) == "n0:30000 (GPU 0)"
    assert _render(NODE_LABEL, op_kwargs={"node": "n0", "other": "x"}) == "n0"
