"""The simulated GPU node: an SGLang 0.5.23 stand-in server, a fake nvidia-smi and their node directory.

node.py      node directory, knobs (SimSettings), memory holders, create_node / write_faults
nvidia_smi   the fake nvidia-smi
presets.py   model presets and install_model (config.json + safetensors index)
server.py    ``python -m sglang_sim.server``: start-up phases, memory registration, fatal messages
args / resolve / pools / graphs   SGLang's flags, start-up hooks, pool sizing, capture memory model
dryrun.py    a launch's start-up memory from its argv, without a process (``dry_run``, ``size_startup``)
perf / engine / textgen           speed model, continuous batching, synthetic outputs
service / http_app / serve        server state, HTTP routes, uvicorn and warm-up
cli.py       ``fleetgen-sim`` subcommands
sshd.py      SSH endpoint running commands "on" a node
local_fleet  servers launched directly on loopback (no SSH, no Airflow), for benchmarks
"""

__version__ = "0.5.23"  # the SGLang release it stands in for; /server_info reports it
