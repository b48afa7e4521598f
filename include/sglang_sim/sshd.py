"""A real SSH server on loopback that runs commands "on" a simulated GPU node.

asyncssh serves the SSH protocol in-process (no root needed); each exec request runs under
``bash -c`` with the node's environment: ``PATH`` starts with the node's ``bin`` (its fake
``nvidia-smi``), ``FLEETGEN_SIM_NODE`` names the node and ``HOME`` is the node's own home folder, so
two simulated nodes on one machine keep separate run and log folders. Host keys are real and the
client must know them (the Airflow connection carries the public host key); clients log in with a
key listed in ``authorized_keys``.

Run: ``python -m sglang_sim.sshd --node DIR --port 2222 --keys KEYDIR``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HOST_KEY_NAME = "ssh_host_ed25519_key"
CLIENT_KEY_NAME = "id_ed25519"


@dataclass(frozen=True)
class KeyPaths:
    host_key: Path
    host_public_key: str   # "ssh-ed25519 AAAA...": what the Airflow connection's host_key extra holds
    client_key: Path
    authorized_keys: Path


def ensure_keys(key_dir: str | Path) -> KeyPaths:
    """Create (once) a host key pair and a client key pair under key_dir; idempotent."""
    import asyncssh

    key_dir = Path(key_dir)
    key_dir.mkdir(parents=True, exist_ok=True)
    host_key_path, client_key_path = key_dir / HOST_KEY_NAME, key_dir / CLIENT_KEY_NAME
    authorized = key_dir / "authorized_keys"
    for path in (host_key_path, client_key_path):
        if not path.exists():
            key = asyncssh.generate_private_key("ssh-ed25519")
            key.write_private_key(str(path))
            key.write_public_key(str(path) + ".pub")
        path.chmod(0o600)  # OpenSSH-style clients refuse private keys others can read
    client_public = (Path(str(client_key_path) + ".pub")).read_text().strip()
    if not authorized.exists() or client_public not in authorized.read_text():
        authorized.write_text(client_public + "\n")
    host_public = " ".join(Path(str(host_key_path) + ".pub").read_text().split()[:2])
    return KeyPaths(host_key_path, host_public, client_key_path, authorized)


def node_environment(node_dir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    home = node_dir / "home"
    home.mkdir(parents=True, exist_ok=True)
    env.update({
        "FLEETGEN_SIM_NODE": str(node_dir),
        "PATH": f"{node_dir / 'bin'}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(home),
        "SHELL": "/bin/bash",
    })
    return env


async def _pump(reader: asyncio.StreamReader, writer) -> None:
    while chunk := await reader.read(65536):
        writer.write(chunk)


async def _feed_stdin(channel_stdin, process_stdin: asyncio.StreamWriter) -> None:
    import asyncssh

    try:
        while data := await channel_stdin.read(65536):
            process_stdin.write(data)
            await process_stdin.drain()
    except (asyncssh.BreakReceived, asyncssh.SignalReceived, asyncssh.TerminalSizeChanged,
            BrokenPipeError, ConnectionResetError):
        pass
    finally:
        try:
            process_stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass


def _make_handler(env: dict[str, str]):
    async def handle(process) -> None:
        command = process.command
        if not command:
            process.stderr.write("this node runs commands only; no interactive shell\n")
            process.exit(1)
            return
        child = await asyncio.create_subprocess_exec(
            "bash", "-c", command, env=env, cwd=env["HOME"],
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        feeder = asyncio.ensure_future(_feed_stdin(process.stdin, child.stdin))
        await asyncio.gather(_pump(child.stdout, process.stdout), _pump(child.stderr, process.stderr))
        exit_status = await child.wait()
        feeder.cancel()
        process.exit(exit_status if exit_status >= 0 else 128 - exit_status)

    return handle


async def serve(node_dir: Path, host: str, port: int, keys: KeyPaths) -> None:
    import asyncssh

    env = node_environment(node_dir)
    server = await asyncssh.create_server(
        asyncssh.SSHServer, host, port,
        server_host_keys=[str(keys.host_key)],
        authorized_client_keys=str(keys.authorized_keys),
        process_factory=_make_handler(env),
        encoding=None,  # bytes end to end: commands' output is passed through untouched
        allow_scp=False,
    )
    print(f"fleetgen-sim sshd: node {node_dir} on {host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()
    await server.wait_closed()


def wait_for_port(host: str, port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {host}:{port} after {timeout_s:.0f} s") from None
            time.sleep(0.05)


def start_sshd(node_dir: str | Path, *, port: int, key_dir: str | Path, host: str = "127.0.0.1",
               log_path: str | Path | None = None) -> subprocess.Popen:
    """Start the SSH server in its own process and return once it accepts connections."""
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL
    process = subprocess.Popen(
        [sys.executable, "-m", "sglang_sim.sshd", "--node", str(node_dir), "--port", str(port),
         "--host", host, "--keys", str(key_dir)],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_port(host, port)
    except TimeoutError:
        process.kill()
        raise
    return process


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fleetgen-sim sshd", description=__doc__.splitlines()[0])
    parser.add_argument("--node", required=True, help="simulated node directory")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback only by default)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--keys", required=True, help="directory holding (or receiving) host and client keys")
    args = parser.parse_args(argv)
    node_dir = Path(args.node).resolve()
    if not (node_dir / "node.json").exists():
        parser.error(f"{node_dir} is not a simulated node (no node.json); create it with `fleetgen-sim create-node`")
    asyncio.run(serve(node_dir, args.host, args.port, ensure_keys(args.keys)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
