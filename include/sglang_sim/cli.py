"""``fleetgen-sim``: manage simulated GPU nodes.

Subcommands (each is a ``(name, add_arguments, run)`` entry in ``COMMANDS``; add new ones there):
  create-node DIR --name N --gpus K [--gpu-name ...] [--total-mib M] [--time-scale X] [--sim JSON]
  install-model DIR [--preset P] [--weights-bytes N]
  hold --gpu I --mib M [--name NAME] [--node DIR]   a process holding memory until killed
  faults --port P '{json}' [--node DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Callable

from sglang_sim.errors import SimError
from sglang_sim.node import NODE_ENV, SimNode, create_node, write_faults
from sglang_sim.presets import install_model, preset_names


def _node_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node", default=os.environ.get(NODE_ENV),
                        help=f"node directory (default: ${NODE_ENV})")


def _load_node(where: str | None) -> SimNode:
    if not where:
        raise SimError(f"no node given and ${NODE_ENV} is not set", hint="pass --node DIR")
    return SimNode.load(where)


def _create_node_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir")
    p.add_argument("--name", required=True)
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--gpu-name", default="NVIDIA B200")
    p.add_argument("--total-mib", type=int, default=183359)
    p.add_argument("--time-scale", type=float)
    p.add_argument("--load-seconds", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--sim", default="{}", help="JSON object of further sim settings (see SimSettings)")


def _create_node(a: argparse.Namespace) -> int:
    sim = json.loads(a.sim)
    for key in ("time_scale", "load_seconds", "seed"):
        if getattr(a, key) is not None:
            sim[key] = getattr(a, key)
    node = create_node(a.dir, name=a.name, gpus=a.gpus, gpu_name=a.gpu_name, total_mib=a.total_mib, sim=sim)
    print(json.dumps({"node": str(node.path), "gpus": len(node.gpus), "env": node.env()}))
    return 0


def _install_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir")
    p.add_argument("--preset", default="qwen3.6-27b", choices=preset_names())
    p.add_argument("--weights-bytes", type=int)


def _install_model(a: argparse.Namespace) -> int:
    print(install_model(a.dir, a.preset, a.weights_bytes))
    return 0


def _hold_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", type=int, required=True)
    p.add_argument("--mib", type=int, required=True)
    p.add_argument("--name", default="python")
    _node_arg(p)


def _hold(a: argparse.Namespace) -> int:
    node = _load_node(a.node)
    if a.mib > node.free_mib(a.gpu):
        print(f"CUDA out of memory: GPU {a.gpu} has {node.free_mib(a.gpu)} MiB free, {a.mib} MiB wanted",
              file=sys.stderr)
        return 1
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.append(1))
    node.set_holder(a.gpu, os.getpid(), a.name, a.mib)
    print(f"holding {a.mib} MiB on GPU {a.gpu} as pid {os.getpid()}", flush=True)
    try:
        while not stop:
            time.sleep(0.2)
    finally:
        node.remove_holder(a.gpu, os.getpid())
    return 0


def _faults_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, required=True)
    p.add_argument("faults", help='JSON object, e.g. \'{"crash_after_requests": 10}\'')
    _node_arg(p)


def _faults(a: argparse.Namespace) -> int:
    print(write_faults(_load_node(a.node), a.port, json.loads(a.faults)))
    return 0


def _sshd_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node", required=True, help="simulated node directory")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback by default)")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--keys", required=True, help="directory holding (or receiving) host and client keys")


def _sshd(a: argparse.Namespace) -> int:
    from sglang_sim import sshd

    return sshd.main(["--node", a.node, "--host", a.host, "--port", str(a.port), "--keys", a.keys])


COMMANDS: list[tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = [
    ("create-node", _create_node_args, _create_node),
    ("install-model", _install_model_args, _install_model),
    ("hold", _hold_args, _hold),
    ("faults", _faults_args, _faults),
    ("sshd", _sshd_args, _sshd),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleetgen-sim", description="Simulated GPU nodes for fleetgen.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, add_arguments, run in COMMANDS:
        sp = sub.add_parser(name)
        add_arguments(sp)
        sp.set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except SimError as exc:
        print(f"fleetgen-sim {args.command}: {exc}", file=sys.stderr)
        return 1
    except json.JSONDecodeError as exc:
        print(f"fleetgen-sim {args.command}: invalid JSON: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
