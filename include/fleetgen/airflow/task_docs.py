"""What each task of ``sglang_generation`` does and what its failure usually means: the task's ``doc_md``
(Airflow shows it on the task's Details tab), and the labels of mapped task instances.

Pure text, no Airflow import; the DAG file attaches it.
"""

from __future__ import annotations

# Labels of mapped task instances (``map_index_template``), rendered with the task's context once its
# arguments are rendered: the grid then reads "gpu-node-1" or "gpu-node-1:30000 (GPU 0,1)", not "3".
NODE_LABEL = "{{ task.op_kwargs['node'] }}"
SERVER_LABEL = ("{{ task.server['node'] }}:{{ task.server['port'] }} "
                "(GPU {{ task.server['gpu_ids'] | join(',') }})")
SHARD_LABEL = ("shard {{ task.op_kwargs['shard']['shard_id'] }}: prompts "
               "{{ task.op_kwargs['shard']['first'] }}-"
               "{{ task.op_kwargs['shard']['first'] + task.op_kwargs['shard']['count'] - 1 }}")

TASK_DOCS = {
    "load_fleet": """
**Reads the fleet description** (the `fleet_file` parameter, else the Airflow Variable `fleetgen_fleet`) and
checks the run's parameters: an unknown key in the run's conf or a prompts file that does not exist stops the
run here, before any node is touched.

*When it fails*: the message names the parameter or the line of the fleet YAML to fix.
""",
    "node_names": "The node names of the fleet: what the per-node tasks are mapped over.",
    "tune.probe_gpus": """
**Runs `nvidia-smi` on one node over SSH** (one task per node, labelled with the node's name): total, used and
free memory per GPU, and which processes hold memory (ours or foreign).

*When it fails*: the SSH connection (`ssh_conn_id` of the node, host key in its `host_key` extra) or a GPU the
fleet names that the node does not have.
""",
    "tune.scan_prompts": """
**Validates the prompts file** (`prompts_path`): structural errors fail with file:line; invalid prompts go to
`rejects.jsonl` in the run's folder.

*When it fails*: the file is not readable on the worker or a line is not JSON; the log names the line.
""",
    "tune.derive_plan": """
**Sizes every server** from its GPUs' free memory and the model: `--mem-fraction-static`,
`--max-running-requests`, `--max-mamba-cache-size`, `--context-length`. The log shows each server's budget table.

*When it fails*: the model does not fit the free memory: lower `max_tokens` or `context_length`, or free the GPUs
(the probe's inventory lists foreign processes).
""",
    "tune.model_identity": """
Hashes the model's `config.json` and safetensors index on the node (`sha256sum` over SSH): with the model path
this is the model identity a completion may be reused under (`reuse_completions`). A failure here is the node
(SSH) or a model directory without those files: check `model.path` in the fleet description.
""",
    "tune.go_live": "Stops the run here (skipping the rest) when `dry_run` is set: the plan was printed above.",
    "servers.stop_servers": """
**Stops only our servers on one node** (pid file and command line must match), TERM then KILL, and waits until
the GPU memory is back.

*When it fails*: memory did not come back (another process holds the GPU) or SSH failed.
""",
    "servers.launch_servers": """
**Launches one SGLang server per GPU / TP group on one node** under `setsid`, with the plan's flags; pid and log
files go to the node's run directory.

*When it fails*: SSH, or the server's Python/module in the fleet description is wrong.
""",
    "servers.servers_to_wait": "Flattens the launched servers into one list: what `wait_ready` is mapped over.",
    "servers.wait_ready": """
**Waits (deferred, in the triggerer) until one server is ready** (labelled `host:port (GPU ids)`), watching its log
for SGLang's fatal lines; reads the *effective* limits from `/server_info`. A memory error re-plans that server
one step smaller and relaunches it (3 times at most).

*When it fails*: the log's first lines say SGLang's own fatal line and which DAG parameter to change
(`memory_margin_mib`, `max_running_requests`, `bf16_ssm_state`, ...), or that the wait timed out
(`ready_timeout_s`).
""",
    "generate.plan_shards": "Cuts the valid prompts into byte-range shards of `shard_size` prompts.",
    "generate.generate_shard": """
**Generates one shard** (labelled with its prompt range) through every ready server, keeping each at its
effective limit × `headroom`; resumes from its checkpoint when retried.

*When it fails*: every server went down (the progress is saved; a retry resumes), or the servers refuse requests
(the log shows SGLang's answer).
""",
    "validate.validate": """
**Great Expectations over the per-completion stats**: one completion per prompt, token and finish-reason bounds,
the shares set in the *Validation thresholds* section. The Data Docs link opens every expectation.

*When it fails*: the message lists each failed expectation with its observed value and sample ids.
""",
    "validate.report": """
**Writes the run report**: throughput overall / per GPU / per server, the tuning used, validation, comparison
with the previous run. The *Report* link above opens it.
""",
    "release_servers": "Stops our servers after the run unless `keep_servers_up` is set (runs whatever happened).",
    "run_outcome": """
Runs only when a task failed: names the failed tasks and their first error line, and keeps the run failed. The
*Failures* link lists every failure of the run with what to check next.
""",
}
