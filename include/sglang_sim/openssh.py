"""A simulated GPU node behind a real OpenSSH ``sshd`` (Debian's openssh-server), on a loopback port.

The daemon runs as the current user with its own configuration, host key and authorized keys (the same
ones the embedded server of ``sshd.py`` uses, so the Airflow connection's ``host_key`` is verified the
same way) and never touches the system's sshd. It can only log in the user it runs as, so the
connection's login is that user. The node's environment is set up as an operator would on a real node,
in the daemon's configuration (``SetEnv``): ``PATH`` starting with the node's ``bin`` (its
``nvidia-smi``), ``HOME`` the node's own home (two nodes on one machine keep separate run and log
folders) and ``FLEETGEN_SIM_NODE``.
"""

from __future__ import annotations

import getpass
import shutil
import subprocess
from pathlib import Path

from sglang_sim import sshd

SSHD_BINARY = "/usr/sbin/sshd"
INSTALL_HINT = "install Debian's openssh-server (apt-get install openssh-server; `make test` does it when root)"


def available() -> bool:
    return Path(SSHD_BINARY).is_file() or shutil.which("sshd") is not None


def login_user() -> str:
    return getpass.getuser()


def write_config(node_dir: Path, *, port: int, keys: sshd.KeyPaths, host: str = "127.0.0.1") -> Path:
    env = sshd.node_environment(node_dir, base={"PATH": "/usr/local/bin:/usr/bin:/bin"})
    folder = node_dir / "openssh"
    folder.mkdir(parents=True, exist_ok=True)
    settings = [f"Port {port}", f"ListenAddress {host}", f"HostKey {keys.host_key}",
                f"AuthorizedKeysFile {keys.authorized_keys}", f"PidFile {folder / 'sshd.pid'}",
                "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
                # not root's system daemon: no PAM session, and keys under /tmp are not held to ownership rules
                "UsePAM no", "StrictModes no", "PermitRootLogin prohibit-password",
                "AllowTcpForwarding no", "X11Forwarding no", "PrintMotd no", "LogLevel VERBOSE",
                "SetEnv " + " ".join(f"{name}={env[name]}" for name in ("PATH", "HOME", "FLEETGEN_SIM_NODE", "SHELL"))]
    path = folder / "sshd_config"
    path.write_text("\n".join(settings) + "\n")
    return path


def start_openssh(node_dir: str | Path, *, port: int, key_dir: str | Path, host: str = "127.0.0.1",
                  log_path: str | Path | None = None) -> subprocess.Popen:
    """Start ``sshd -D -e`` for one node and return once it accepts connections."""
    node_dir = Path(node_dir)
    keys = sshd.ensure_keys(key_dir)
    config = write_config(node_dir, port=port, keys=keys, host=host)
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # its privilege-separation directory must exist
    binary = SSHD_BINARY if Path(SSHD_BINARY).is_file() else shutil.which("sshd")
    subprocess.run([binary, "-t", "-f", str(config)], check=True, capture_output=True)
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL
    process = subprocess.Popen([binary, "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        sshd.wait_for_port(host, port)
    except TimeoutError:
        process.kill()
        raise
    return process
