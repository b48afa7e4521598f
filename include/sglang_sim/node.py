"""A simulated GPU node: a directory that holds its GPUs, their memory holders and its knobs.

Layout (shared with the SSH endpoint and the demo)::

    <node>/node.json                 {"name", "gpus": [{index, name, total_mib, uuid}], "sim": {...}}
    <node>/bin/nvidia-smi            answers from the live state below
    <node>/state/gpu<i>/<pid>.json   memory holders {"pid", "process_name", "used_mib"}
    <node>/faults/<port>.json        faults for the server launched on that port

A holder whose pid is no longer alive is ignored by every reader, as the driver frees the memory
of a killed process (so ``kill -9`` frees memory), and is removed when next seen.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from sglang_sim.errors import SimConfigError
from sglang_sim.faults import Faults, faults_path

NODE_ENV = "FLEETGEN_SIM_NODE"
NODE_FILE = "node.json"


@dataclass(frozen=True)
class SimSettings:
    """Generation and timing knobs of a node (``node.json`` "sim"). ``None`` means derived.

    time_scale            simulated seconds per wall second for generation (100: a 100 s job takes 1 s).
    load_seconds          wall seconds a server spends from launch to an open port (not scaled).
    seed                  node seed mixed into every per-prompt draw (output length, text).
    driver_baseline_mib   memory.used of an idle GPU (driver reservations; B200 idle shows a few
                          hundred MiB).
    cuda_context_mib      a server process's CUDA context + torch allocator start-up, per GPU.
    nccl_mib              extra per GPU for NCCL/custom all-reduce buffers when tp > 1.
    runtime_workspace_mib cuBLAS/attention-backend/sampler workspaces a server needs outside its
                          static pools at graph capture (see graphs.py).
    output_mean_tokens    mean of the untruncated output-length distribution (gamma). With
                          max_tokens 4096 the delivered mean is ~2,500 and ~13 % stop by length.
    output_shape          gamma shape of output lengths (larger: less spread).
    think_share           share of an output that is reasoning (the rest is the answer).
    draft_acceptance      the chance a draft token is accepted given its predecessors were (per position,
                          the same at every batch size); a verify of D draft tokens gains
                          1 + a + ... + a^(D-1) tokens (perf.accept_length). 0.86: docs/simulator-speed.md §1.
    decode_base_ms        decode step time at batch 0; None: weights/HBM bandwidth + launch
                          overhead (perf.py).
    decode_per_request_ms decode step time added per running request; None: derived (perf.py).
    prefill_tokens_per_s  prompt tokens per second; None: derived from FLOPs (perf.py).
    """

    time_scale: float = 1.0
    load_seconds: float = 2.0
    seed: int = 0
    driver_baseline_mib: int = 512
    cuda_context_mib: int = 600
    nccl_mib: int = 400
    runtime_workspace_mib: int = 1024
    output_mean_tokens: float = 2640.0
    output_shape: float = 4.0
    think_share: float = 0.85
    draft_acceptance: float = 0.86
    decode_base_ms: float | None = None
    decode_per_request_ms: float | None = None
    prefill_tokens_per_s: float | None = None

    def __post_init__(self) -> None:
        positive = ("time_scale", "output_mean_tokens", "output_shape", "draft_acceptance")
        for name in positive:
            if not float(getattr(self, name)) > 0:
                raise ValueError(f"sim.{name} must be > 0, got {getattr(self, name)!r}")
        non_negative = ("load_seconds", "driver_baseline_mib", "cuda_context_mib", "nccl_mib",
                        "runtime_workspace_mib")
        for name in non_negative:
            if float(getattr(self, name)) < 0:
                raise ValueError(f"sim.{name} must be >= 0, got {getattr(self, name)!r}")
        if not 0.0 <= self.think_share < 1.0:
            raise ValueError(f"sim.think_share must be within [0, 1), got {self.think_share!r}")
        if not 0 < self.draft_acceptance <= 1:
            raise ValueError(f"sim.draft_acceptance must be within (0, 1], got {self.draft_acceptance!r}")
        for name in ("decode_base_ms", "decode_per_request_ms", "prefill_tokens_per_s"):
            value = getattr(self, name)
            if value is not None and float(value) < 0:
                raise ValueError(f"sim.{name} must be >= 0 or null, got {value!r}")

    @classmethod
    def from_dict(cls, data: dict | None, *, path: str | None = None) -> "SimSettings":
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SimConfigError(f"unknown sim settings {unknown}", path=path,
                              hint=f"known settings: {sorted(known)}")
        try:
            return cls(**data)
        except (TypeError, ValueError) as exc:
            raise SimConfigError(f"invalid sim settings: {exc}", path=path,
                              hint="see SimSettings in include/sglang_sim/node.py") from exc


@dataclass(frozen=True)
class GpuSpec:
    index: int
    name: str
    total_mib: int
    uuid: str

    def __post_init__(self) -> None:
        if self.index < 0 or self.total_mib <= 0 or not self.name:
            raise ValueError(f"invalid GPU {self!r}")


@dataclass(frozen=True)
class Holder:
    pid: int
    process_name: str
    used_mib: int


def pid_alive(pid: int) -> bool:
    """True if ``pid`` runs and is not a zombie (a killed child not yet reaped holds no memory)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            # state is the field after the parenthesised command name
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (FileNotFoundError, IndexError):
        return os.path.exists(f"/proc/{pid}") if os.path.isdir("/proc") else True


def _stable_uuid(node_name: str, index: int) -> str:
    digest = hashlib.sha1(f"{node_name}/{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def _write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


@dataclass(frozen=True)
class SimNode:
    path: Path
    name: str
    gpus: tuple[GpuSpec, ...]
    sim: SimSettings = field(default_factory=SimSettings)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "SimNode":
        path = Path(path).resolve()
        node_file = path / NODE_FILE
        try:
            data = json.loads(node_file.read_text())
        except FileNotFoundError:
            raise SimConfigError("not a simulated node (no node.json)", path=str(node_file),
                              hint="create it with `fleetgen-sim create-node DIR`") from None
        except json.JSONDecodeError as exc:
            raise SimConfigError(f"node.json is not valid JSON: {exc}", path=str(node_file),
                              line=exc.lineno) from exc
        try:
            gpus = tuple(GpuSpec(int(g["index"]), str(g["name"]), int(g["total_mib"]), str(g["uuid"]))
                         for g in data["gpus"])
            name = str(data["name"])
        except (KeyError, TypeError, ValueError) as exc:
            raise SimConfigError(f"node.json lacks a valid 'name'/'gpus': {exc}", path=str(node_file)) from exc
        return cls(path, name, gpus, SimSettings.from_dict(data.get("sim"), path=str(node_file)))

    @classmethod
    def from_env(cls) -> "SimNode":
        where = os.environ.get(NODE_ENV)
        if not where:
            raise SimConfigError(f"${NODE_ENV} is not set",
                              hint="run commands on a simulated node with SimNode.env() applied")
        return cls.load(where)

    def env(self) -> dict[str, str]:
        """Environment a command running "on" this node needs (merge into os.environ)."""
        path = os.environ.get("PATH", "")
        return {NODE_ENV: str(self.path), "PATH": f"{self.path / 'bin'}{os.pathsep}{path}" if path
                else str(self.path / "bin")}

    def gpu(self, index: int) -> GpuSpec:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        raise SimConfigError(f"node {self.name} has no GPU {index}", path=str(self.path / NODE_FILE),
                          hint=f"GPUs present: {[g.index for g in self.gpus]}")

    def _holder_dir(self, index: int) -> Path:
        return self.path / "state" / f"gpu{index}"

    def holders(self, index: int) -> list[Holder]:
        """Live memory holders on one GPU; files of dead processes are removed."""
        found = []
        directory = self._holder_dir(index)
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            return []
        for entry in entries:
            if not entry.name.endswith(".json") or entry.name.startswith("."):
                continue
            try:
                data = json.loads(Path(entry.path).read_text())
                holder = Holder(int(data["pid"]), str(data["process_name"]), int(data["used_mib"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # being replaced or torn: the next read sees it whole
            if pid_alive(holder.pid):
                found.append(holder)
            else:
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass
        return sorted(found, key=lambda h: h.pid)

    def set_holder(self, index: int, pid: int, process_name: str, used_mib: int) -> None:
        self.gpu(index)
        directory = self._holder_dir(index)
        directory.mkdir(parents=True, exist_ok=True)
        _write_json_atomic(directory / f"{pid}.json",
                           {"pid": int(pid), "process_name": process_name, "used_mib": int(used_mib)})

    def remove_holder(self, index: int, pid: int) -> None:
        try:
            os.unlink(self._holder_dir(index) / f"{pid}.json")
        except FileNotFoundError:
            pass

    def used_mib(self, index: int) -> int:
        return self.sim.driver_baseline_mib + sum(h.used_mib for h in self.holders(index))

    def free_mib(self, index: int) -> int:
        return max(0, self.gpu(index).total_mib - self.used_mib(index))

    def gpu_memory(self) -> list[dict]:
        """Live per-GPU memory: the shape the probe stage reports."""
        report = []
        for gpu in self.gpus:
            holders = self.holders(gpu.index)
            used = self.sim.driver_baseline_mib + sum(h.used_mib for h in holders)
            report.append({
                "index": gpu.index, "name": gpu.name, "uuid": gpu.uuid, "total_mib": gpu.total_mib,
                "used_mib": used, "free_mib": max(0, gpu.total_mib - used),
                "processes": [asdict(h) for h in holders],
            })
        return report

    def faults_path(self, port: int) -> Path:
        return faults_path(self.path, port)


def create_node(path: str | os.PathLike, *, name: str, gpus: list[tuple[str, int]] | int,
                gpu_name: str = "NVIDIA B200", total_mib: int = 183359,
                sim: dict | None = None) -> SimNode:
    """Create a node directory (or refresh its node.json and nvidia-smi, keeping state/faults)."""
    path = Path(path).resolve()
    if isinstance(gpus, int):
        if gpus < 1:
            raise SimConfigError(f"a node needs at least one GPU, got {gpus}", path=str(path))
        specs = [(gpu_name, total_mib)] * gpus
    else:
        specs = [(str(n), int(m)) for n, m in gpus]
        if not specs:
            raise SimConfigError("a node needs at least one GPU", path=str(path))
    settings = SimSettings.from_dict(sim, path=str(path / NODE_FILE))
    node = SimNode(path, name, tuple(GpuSpec(i, n, m, _stable_uuid(name, i))
                                     for i, (n, m) in enumerate(specs)), settings)
    for sub in ("bin", "faults", *(f"state/gpu{g.index}" for g in node.gpus)):
        (path / sub).mkdir(parents=True, exist_ok=True)
    _write_json_atomic(path / NODE_FILE, {"name": name, "gpus": [asdict(g) for g in node.gpus],
                                          "sim": asdict(settings)})
    script = path / "bin" / "nvidia-smi"
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom sglang_sim.nvidia_smi import main\n"
                      f"sys.exit(main(node_path={str(path)!r}))\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return node


def write_faults(node: SimNode | str | os.PathLike, port: int, faults: dict) -> Path:
    """Write (validated) faults for the server that will be launched on ``port``."""
    node_path = node.path if isinstance(node, SimNode) else Path(node)
    target = faults_path(node_path, port)
    Faults.from_dict(faults, path=str(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    _write_json_atomic(target, dict(faults))
    return target
