"""Labels of the DAG's mapped task instances. Pure text, no Airflow import; the DAG file attaches them.

Each task's documentation (its Details tab) is its callable's docstring, which Airflow shows as ``doc_md``.
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
