"""The GPU nodes: the fleet description, the ``nvidia-smi`` probe, the quoted shell commands run on a
node, and the reading of what a server says about itself (log lines, ``/server_info``)."""
