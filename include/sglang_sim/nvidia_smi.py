"""A fake ``nvidia-smi`` answering from a simulated node's live state, in nvidia-smi's CSV format.

Supported: no arguments (a compact memory/process table), ``--query-gpu=FIELDS``, ``--query-compute-apps=FIELDS``, ``--format=csv[,noheader][,nounits]``,
``-i/--id=0,1`` (index or UUID), ``-L/--list-gpus``. Fields are separated by ", "; with units, MiB
values read ``183359 MiB`` and headers carry ``[MiB]`` (also with ``nounits``, as nvidia-smi does).
``utilization.gpu`` and ``power.draw`` follow the load the node's servers report (``sglang_sim.gpu_load``).
An unknown field prints ``Field "x" is not a valid field to query.`` and exits 2.
"""

from __future__ import annotations

import os
import sys

from sglang_sim.gpu_load import gpu_loads, gpu_power
from sglang_sim.node import NODE_ENV, SimNode

DRIVER_VERSION = "570.133.20"
INVALID_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."

# query-gpu field -> (header, unit or None); aliases map onto the same value
_GPU_FIELDS = {
    "index": ("index", None), "uuid": ("uuid", None), "gpu_uuid": ("uuid", None),
    "name": ("name", None), "gpu_name": ("name", None),
    "memory.total": ("memory.total", "MiB"), "memory.used": ("memory.used", "MiB"),
    "memory.free": ("memory.free", "MiB"),
    "pci.bus_id": ("pci.bus_id", None), "gpu_bus_id": ("pci.bus_id", None),
    "driver_version": ("driver_version", None), "count": ("count", None),
    "utilization.gpu": ("utilization.gpu", "%"), "power.draw": ("power.draw", "W"),
    "power.limit": ("power.limit", "W"),
}
_APP_FIELDS = {
    "gpu_uuid": ("gpu_uuid", None), "gpu_bus_id": ("gpu_bus_id", None), "gpu_name": ("gpu_name", None),
    "pid": ("pid", None), "process_name": ("process_name", None), "name": ("process_name", None),
    "used_memory": ("used_gpu_memory", "MiB"), "used_gpu_memory": ("used_gpu_memory", "MiB"),
}


class _Usage(Exception):
    def __init__(self, text: str, code: int) -> None:
        super().__init__(text)
        self.code = code


def _bus_id(index: int) -> str:
    return f"00000000:{0x18 + 0x10 * index:02X}:00.0"


def _parse(argv: list[str]) -> dict:
    opts: dict = {"query": None, "fields": None, "format": None, "ids": None, "list": False}
    i = 0
    while i < len(argv):
        arg = argv[i]
        key, eq, value = arg.partition("=")

        def take() -> str:
            nonlocal i
            if eq:
                return value
            i += 1
            if i >= len(argv):
                raise _Usage(INVALID_ARGS, 2)
            return argv[i]

        if key in ("--query-gpu", "--query-compute-apps"):
            opts["query"] = "gpu" if key == "--query-gpu" else "apps"
            opts["fields"] = [f.strip() for f in take().split(",") if f.strip()]
        elif key == "--format":
            opts["format"] = {p.strip() for p in take().split(",")}
        elif key in ("-i", "--id"):
            opts["ids"] = [p.strip() for p in take().split(",") if p.strip()]
        elif arg in ("-L", "--list-gpus"):
            opts["list"] = True
        else:
            raise _Usage(INVALID_ARGS, 2)
        i += 1
    return opts


def _select(node: SimNode, ids: list[str] | None) -> list:
    if ids is None:
        return list(node.gpus)
    chosen = []
    for ident in ids:
        match = [g for g in node.gpus if ident == str(g.index) or ident == g.uuid]
        if not match:
            raise _Usage("No devices were found", 6)
        chosen.extend(g for g in match if g not in chosen)
    return chosen


def render(node: SimNode, argv: list[str]) -> tuple[str, int]:
    """Output text and exit code of ``nvidia-smi argv`` on ``node``."""
    try:
        opts = _parse(argv)
        gpus = _select(node, opts["ids"])
        if opts["list"]:
            return "".join(f"GPU {g.index}: {g.name} (UUID: {g.uuid})\n" for g in gpus), 0
        if opts["query"] is None:
            if argv and opts["ids"] is None:
                raise _Usage(INVALID_ARGS, 2)
            return _summary(node, gpus), 0
        fmt = opts["format"]
        if fmt is None or "csv" not in fmt or not fmt <= {"csv", "noheader", "nounits"}:
            raise _Usage('"--format" must be specified with "csv"' if fmt is None else INVALID_ARGS, 2)
        table = _GPU_FIELDS if opts["query"] == "gpu" else _APP_FIELDS
        for name in opts["fields"]:
            if name not in table:
                raise _Usage(f'Field "{name}" is not a valid field to query.', 2)
    except _Usage as usage:
        return f"{usage}\n", usage.code
    units = "nounits" not in fmt
    rows = _gpu_rows(node, gpus) if opts["query"] == "gpu" else _app_rows(node, gpus)
    lines = []
    if "noheader" not in fmt:
        lines.append(", ".join(table[f][0] + (f" [{table[f][1]}]" if table[f][1] else "")
                               for f in opts["fields"]))
    for row in rows:
        cells = []
        for name in opts["fields"]:
            value = row[table[name][0]]
            cells.append(f"{value} {table[name][1]}" if units and table[name][1] else str(value))
        lines.append(", ".join(cells))
    return "".join(line + "\n" for line in lines), 0


def _summary(node: SimNode, gpus: list) -> str:
    """A compact version of the default table: memory per GPU, then the processes holding it."""
    rule = "+" + "-" * 78 + "+\n"
    lines = [rule, f"| NVIDIA-SMI (simulated node {node.name})   Driver Version: {DRIVER_VERSION}".ljust(79) + "|\n", rule]
    for row in _gpu_rows(node, gpus):
        lines.append(f"| {row['index']:>3}  {row['name']:<32} {row['pci.bus_id']}  "
                     f"{row['memory.used']:>6}MiB / {row['memory.total']:>6}MiB".ljust(79) + "|\n")
    lines += [rule, "| Processes:".ljust(79) + "|\n", "|  GPU        PID  Process name".ljust(64) + "GPU Memory".ljust(15) + "|\n"]
    apps = _app_rows(node, gpus)
    by_uuid = {g.uuid: g.index for g in gpus}
    for app in apps:
        lines.append(f"| {by_uuid[app['gpu_uuid']]:>4} {app['pid']:>10}  {app['process_name']:<40}".ljust(64)
                     + f"{app['used_gpu_memory']}MiB".rjust(12).ljust(15) + "|\n")
    if not apps:
        lines.append("|  No running processes found".ljust(79) + "|\n")
    lines.append(rule)
    return "".join(lines)


def _gpu_rows(node: SimNode, gpus: list) -> list[dict]:
    rows = []
    loads = gpu_loads(node)
    for gpu in gpus:
        used = node.used_mib(gpu.index)
        utilization, power_share = loads.get(gpu.index, (0.0, 0.0))
        idle_w, limit_w = gpu_power(gpu.name)
        rows.append({"index": gpu.index, "uuid": gpu.uuid, "name": gpu.name,
                     "memory.total": gpu.total_mib, "memory.used": used,
                     "memory.free": max(0, gpu.total_mib - used), "pci.bus_id": _bus_id(gpu.index),
                     "driver_version": DRIVER_VERSION, "count": len(node.gpus),
                     "utilization.gpu": int(round(utilization)),
                     "power.draw": f"{idle_w + (limit_w - idle_w) * power_share:.2f}",
                     "power.limit": f"{limit_w:.2f}"})
    return rows


def _app_rows(node: SimNode, gpus: list) -> list[dict]:
    rows = []
    for gpu in gpus:
        for holder in node.holders(gpu.index):
            rows.append({"gpu_uuid": gpu.uuid, "gpu_bus_id": _bus_id(gpu.index), "gpu_name": gpu.name,
                         "pid": holder.pid, "process_name": holder.process_name,
                         "used_gpu_memory": holder.used_mib})
    return rows


def main(argv: list[str] | None = None, *, node_path: str | None = None) -> int:
    where = node_path or os.environ.get(NODE_ENV)
    if not where:
        sys.stdout.write("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                         "Make sure that the latest NVIDIA driver is installed and running.\n")
        return 9
    text, code = render(SimNode.load(where), sys.argv[1:] if argv is None else argv)
    sys.stdout.write(text)
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
