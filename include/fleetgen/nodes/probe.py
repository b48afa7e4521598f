"""GPU inventory from ``nvidia-smi`` CSV queries, run on a node in one SSH round trip.

The inventory is what the tuner plans from: per GPU its total, used and free MiB and who holds
memory, each process marked ``ours`` when it is one of our servers (its memory comes back when we
stop it) or foreign (its memory does not).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence

from fleetgen.nodes import remote
from fleetgen.errors import ProbeError

GPU_FIELDS = ("index", "uuid", "name", "memory.total", "memory.used", "memory.free")
APP_FIELDS = ("gpu_uuid", "pid", "process_name", "used_memory")
GPU_QUERY = f"nvidia-smi --query-gpu={','.join(GPU_FIELDS)} --format=csv,noheader,nounits"
APP_QUERY = f"nvidia-smi --query-compute-apps={','.join(APP_FIELDS)} --format=csv,noheader,nounits"


def probe_command(*, run_dir: str, module: str, ports: Sequence[int]) -> str:
    return remote.sections_command({
        "gpus": GPU_QUERY,
        "apps": APP_QUERY,
        "ours": remote.our_pids_command(run_dir=run_dir, module=module, ports=ports),
        "marked": remote.marked_pids_command(run_dir=run_dir, ports=ports),
    })


def _rows(text: str) -> list[list[str]]:
    return [[cell.strip() for cell in row] for row in csv.reader(io.StringIO(text)) if row and any(row)]


def _mib(value: str, what: str, host: str, line: int) -> int:
    text = value.strip()
    if text.endswith("MiB"):
        text = text[:-3].strip()
    try:
        return int(text)
    except ValueError:
        raise ProbeError(f"cannot read {what} from {value!r}", host=host, line=line) from None


def _is_placeholder(value: str) -> bool:
    """nvidia-smi prints a bracketed word instead of a value it cannot read: ``[N/A]``, ``[Not Supported]``,
    ``[GPU requires reset]``, ``[Unknown Error]``, ``[Insufficient Permissions]``..."""
    text = value.strip()
    return (text.startswith("[") and text.endswith("]")) or text == "N/A"


def _unreadable_hint(value: str, index: int, host: str) -> str:
    """What to do about a GPU whose memory nvidia-smi cannot read; leaving it out of the fleet always works."""
    leave_out = f"or leave GPU {index} out of the node's gpus / tp_groups in the fleet file until it is fixed"
    text = value.strip()
    if text == "[GPU requires reset]":
        return (f"reset it (as root, with no process on it: `nvidia-smi --gpu-reset -i {index}`) or reboot {host}, "
                f"{leave_out}")
    if text in ("[N/A]", "[Not Supported]", "N/A"):
        return f"the probe needs per-GPU memory: check the driver and MIG mode (`nvidia-smi -q -i {index}`), {leave_out}"
    return (f"check the driver on {host} (`nvidia-smi -q -i {index}`, Xid errors in `dmesg`); reset the GPU or reboot "
            f"if it persists, {leave_out}")


def parse_gpu_csv(text: str, *, host: str) -> list[dict]:
    """Parse the output of :data:`GPU_QUERY` (noheader, nounits)."""
    gpus = []
    for line_no, row in enumerate(_rows(text), start=1):
        if len(row) != len(GPU_FIELDS):
            raise ProbeError(f"expected {len(GPU_FIELDS)} fields ({', '.join(GPU_FIELDS)}), got {len(row)}: "
                             f"{', '.join(row)}", host=host, line=line_no)
        try:
            index = int(row[0])
        except ValueError:
            raise ProbeError(f"GPU index {row[0]!r} is not an integer", host=host, line=line_no) from None
        gpu = {"index": index, "uuid": row[1], "name": row[2], "processes": []}
        unreadable = next(((field, value) for field, value in zip(GPU_FIELDS[3:], row[3:]) if _is_placeholder(value)),
                          None)
        if unreadable is None:
            gpu.update(total_mib=_mib(row[3], "memory.total", host, line_no),
                       used_mib=_mib(row[4], "memory.used", host, line_no),
                       free_mib=_mib(row[5], "memory.free", host, line_no))
        else:
            # Kept, not refused: a GPU the fleet does not use may be broken (select_gpus refuses a used one).
            gpu.update(total_mib=None, used_mib=None, free_mib=None,
                       unreadable={"field": unreadable[0], "value": unreadable[1]})
        gpus.append(gpu)
    if not gpus:
        raise ProbeError("nvidia-smi listed no GPUs", host=host, hint="is the driver loaded? run nvidia-smi on the node")
    return gpus


def parse_apps_csv(text: str, *, host: str) -> list[dict]:
    """Parse the output of :data:`APP_QUERY` (noheader, nounits)."""
    apps = []
    for line_no, row in enumerate(_rows(text), start=1):
        if len(row) == 1 and row[0].lower().startswith("no running"):
            continue
        if len(row) != len(APP_FIELDS):
            raise ProbeError(f"expected {len(APP_FIELDS)} fields ({', '.join(APP_FIELDS)}), got {len(row)}",
                             host=host, line=line_no)
        try:
            pid = int(row[1])
        except ValueError:
            raise ProbeError(f"pid {row[1]!r} is not an integer", host=host, line=line_no) from None
        used = 0 if _is_placeholder(row[3]) else _mib(row[3], "used_memory", host, line_no)
        apps.append({"gpu_uuid": row[0], "pid": pid, "process_name": row[2], "used_mib": used})
    return apps


def parse_our_pids(text: str, tags: Sequence[str] = ("ours",)) -> dict[int, int]:
    """``ours port=P pid=N`` lines (or those of ``tags``) -> {pid: port}."""
    return {int(fields["pid"]): int(fields["port"]) for _, fields in remote.parse_records(text, tuple(tags))
            if "pid" in fields and "port" in fields}


def build_inventory(host: str, gpus: list[dict], apps: list[dict], our_pids: dict[int, int]) -> dict:
    by_uuid = {gpu["uuid"]: gpu for gpu in gpus}
    for app in apps:
        gpu = by_uuid.get(app["gpu_uuid"])
        if gpu is None:
            continue  # a process on a GPU outside the query (e.g. filtered by -i)
        port = our_pids.get(app["pid"])
        gpu["processes"].append({"pid": app["pid"], "process_name": app["process_name"],
                                 "used_mib": app["used_mib"], "ours": port is not None, "port": port})
    for gpu in gpus:
        gpu["processes"].sort(key=lambda p: p["pid"])
    return {"host": host, "gpus": sorted(gpus, key=lambda g: g["index"])}


def parse_probe_output(output: str, *, host: str) -> dict:
    sections = remote.split_sections(output)
    for name in ("gpus", "apps"):
        if name not in sections:
            raise ProbeError(f"the probe printed no '{name}' section", host=host,
                             hint="the remote shell must be bash; check the output of the probe command")
        rc, text = sections[name]
        if rc != 0:
            raise ProbeError(f"nvidia-smi failed (exit {rc}): {text.strip()[:500]}", host=host,
                             hint="is nvidia-smi on the remote PATH and does it work when run by hand?")
    gpus = parse_gpu_csv(sections["gpus"][1], host=host)
    apps = parse_apps_csv(sections["apps"][1], host=host)
    # a process carrying our launch marker is ours too: the server's children hold its GPU memory
    ours = {**parse_our_pids(sections.get("marked", (0, ""))[1], ("marked",)),
            **parse_our_pids(sections.get("ours", (0, ""))[1])}
    return build_inventory(host, gpus, apps, ours)


def select_gpus(inventory: dict, gpu_ids: Sequence[int]) -> list[dict]:
    """The inventory rows of the given GPU indices; a missing index, or a GPU whose memory nvidia-smi cannot
    read (``[GPU requires reset]``...), is an error naming the host and the GPU."""
    by_index = {gpu["index"]: gpu for gpu in inventory["gpus"]}
    missing = [g for g in gpu_ids if g not in by_index]
    if missing:
        raise ProbeError(f"the fleet names GPU(s) {missing} but nvidia-smi lists only {sorted(by_index)}",
                         host=inventory["host"], hint="fix nodes[].gpus in the fleet description")
    for index in gpu_ids:
        unreadable = by_index[index].get("unreadable")
        if unreadable:
            raise ProbeError(f"GPU {index} ({by_index[index]['uuid']}): nvidia-smi reports {unreadable['field']} as "
                             f"{unreadable['value']!r}", host=inventory["host"],
                             hint=_unreadable_hint(unreadable["value"], index, inventory["host"]))
    return [by_index[g] for g in gpu_ids]


def format_inventory(inventory: dict) -> str:
    """A few lines a person can read in the task log."""
    lines = [f"{inventory['host']}: {len(inventory['gpus'])} GPU(s)"]
    for gpu in inventory["gpus"]:
        if gpu.get("unreadable"):
            lines.append(f"  GPU {gpu['index']} {gpu['name']}: unusable, nvidia-smi reports "
                         f"{gpu['unreadable']['field']} as {gpu['unreadable']['value']}")
            continue
        holders = ", ".join(f"{p['process_name']}[{p['pid']}{' ours' if p['ours'] else ''}] {p['used_mib']} MiB"
                            for p in gpu["processes"]) or "no processes"
        lines.append(f"  GPU {gpu['index']} {gpu['name']}: total {gpu['total_mib']} MiB, used {gpu['used_mib']}, "
                     f"free {gpu['free_mib']} ({holders})")
    return "\n".join(lines)
