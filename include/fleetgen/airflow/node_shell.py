"""Run fleetgen's remote commands on a node through the Airflow SSH provider's hook.

A thin layer over ``SSHHook``: one connection per task, commands from :mod:`fleetgen.nodes.remote`,
optional stdin (how secrets travel), and errors that name the node and the connection id instead of
a paramiko stack trace.
"""

from __future__ import annotations

import logging
import socket
import time

from fleetgen.errors import AuthenticationRefused, ConfigError, HostKeyMismatch, HostUnreachable, RemoteError
from fleetgen.nodes.host_keys import describe
from fleetgen.nodes.remote import quote

log = logging.getLogger(__name__)


def host_key_mismatch(node: str, ssh_conn_id: str, address: str, *, expected: str,
                      received: str) -> HostKeyMismatch:
    return HostKeyMismatch(f"the host key of {address} does not match connection '{ssh_conn_id}'",
                           expected=expected, received=received, host=node,
                           hint="someone may be impersonating the node, or it was reinstalled: compare the received "
                                "fingerprint with `ssh-keygen -lf` of the node's host key, then update the "
                                "connection's host_key extra")


def key_file_unreadable(node: str, ssh_conn_id: str, key_file: str, reason: str) -> ConfigError:
    """The connection's key file cannot be read on this machine: its configuration, not the node."""
    return ConfigError(f"the key file {key_file} of SSH connection '{ssh_conn_id}' cannot be read on this machine: "
                       f"{reason}", host=node, path=key_file,
                       hint=f"fix key_file in the extra of the Airflow connection '{ssh_conn_id}', or put the private "
                            f"key there, readable by the user the workers and the triggerer run as")


def authentication_refused(node: str, ssh_conn_id: str, reason: str) -> AuthenticationRefused:
    return AuthenticationRefused(
        f"the node refused the login of SSH connection '{ssh_conn_id}': {reason}", host=node,
        hint=f"fix the login and key_file (or private_key) of the Airflow connection '{ssh_conn_id}', or add its "
             f"public key to ~/.ssh/authorized_keys of that login on the node; retrying cannot help")


def file_error(exc: OSError) -> str | None:
    """The file an OSError is about (a key file that cannot be read), None for a network error."""
    return exc.filename if isinstance(exc.filename, str) else None


class NodeShell:
    def __init__(self, node: str, ssh_conn_id: str, *, conn_timeout_s: int = 10) -> None:
        self.node = node
        self.ssh_conn_id = ssh_conn_id
        self.conn_timeout_s = conn_timeout_s
        self._client = None

    def _connect(self):
        if self._client is not None:
            transport = self._client.get_transport()
            if transport is not None and transport.is_active():
                return self._client
        import paramiko
        from airflow.providers.ssh.hooks.ssh import SSHHook

        try:
            hook = SSHHook(ssh_conn_id=self.ssh_conn_id, conn_timeout=self.conn_timeout_s)
            hook.conn_retry_attempts = 1  # fail fast: the task's own retries handle flaky networks
            self._client = hook.get_conn()
        except paramiko.BadHostKeyException as exc:
            raise host_key_mismatch(self.node, self.ssh_conn_id, exc.hostname,
                                    expected=describe(exc.expected_key.get_name(), exc.expected_key.asbytes()),
                                    received=describe(exc.key.get_name(), exc.key.asbytes())) from None
        except paramiko.AuthenticationException as exc:
            raise authentication_refused(self.node, self.ssh_conn_id, f"{exc}") from None
        except paramiko.SSHException as exc:
            raise HostUnreachable(f"SSH to node failed via connection '{self.ssh_conn_id}': {exc}", host=self.node,
                                  hint="check the connection's host key, login and key file") from None
        except (OSError, socket.timeout) as exc:
            if file_error(exc):  # paramiko opens the key file after the TCP connect: not the network
                raise key_file_unreadable(self.node, self.ssh_conn_id, file_error(exc), exc.strerror or f"{exc}") \
                    from None
            raise HostUnreachable(f"cannot reach the node via connection '{self.ssh_conn_id}': "
                                  f"{exc.__class__.__name__}: {exc}", host=self.node,
                                  hint="is the node up and its SSH port open from this worker?") from None
        except Exception as exc:  # the provider raises AirflowException for configuration problems
            raise HostUnreachable(f"cannot open SSH connection '{self.ssh_conn_id}': {exc}", host=self.node,
                                  hint="check the Airflow connection (host, port, login, key_file, host_key)") from None
        return self._client

    def run(self, command: str, *, stdin: str | None = None, timeout_s: float = 120.0,
            check: bool = True, describe: str = "command") -> tuple[int, str, str]:
        """Run ``command`` under bash on the node; return (exit status, stdout, stderr).

        ``stdin`` is written to the channel and never logged. With ``check``, a non-zero exit raises
        RemoteError carrying the node and the command's stderr.
        """
        client = self._connect()
        started = time.monotonic()
        try:
            channel_in, channel_out, channel_err = client.exec_command(
                "bash -c " + quote(command), timeout=timeout_s)
            if stdin is not None:
                channel_in.write(stdin)
                channel_in.flush()
            channel_in.channel.shutdown_write()
            out = channel_out.read().decode("utf-8", "replace")
            err = channel_err.read().decode("utf-8", "replace")
            status = channel_out.channel.recv_exit_status()
        except (socket.timeout, TimeoutError):
            raise RemoteError(f"{describe} did not finish within {timeout_s:.0f} s", host=self.node) from None
        except OSError as exc:
            raise HostUnreachable(f"connection lost during {describe}: {exc}", host=self.node) from None
        log.debug("%s on %s took %.2f s (exit %s)", describe, self.node, time.monotonic() - started, status)
        if check and status != 0:
            raise RemoteError(f"{describe} failed with exit status {status}: {err.strip()[-2000:] or out.strip()[-2000:]}",
                              host=self.node)
        return status, out, err

    def stream(self, command: str, *, describe: str = "command") -> "RemoteLines":
        """Start ``command`` under bash on the node and read its stdout line by line as it comes;
        ``close()`` on the result ends the session (the remote command sees its output closed) and this
        shell's connection: open a NodeShell of its own for each stream."""
        client = self._connect()
        try:
            _, channel_out, _ = client.exec_command("bash -c " + quote(command))
        except OSError as exc:
            raise HostUnreachable(f"connection lost starting {describe}: {exc}", host=self.node) from None
        return RemoteLines(channel_out, self)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> "NodeShell":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()



class RemoteLines:
    """A running remote command's stdout as text lines (see ``NodeShell.stream``)."""

    def __init__(self, channel_file, shell: NodeShell) -> None:
        self._file = channel_file
        self._shell = shell

    def __iter__(self):
        for line in self._file:
            yield (line.decode("utf-8", "replace") if isinstance(line, bytes) else line).rstrip("\n")

    def close(self) -> None:
        self._file.channel.close()
        self._shell.close()
