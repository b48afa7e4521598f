"""NodeShell over a fake SSHHook and paramiko client: which error each connection failure becomes, how a
command's input, output, exit status and timeout travel, and how a stream is read and closed. No network."""

from __future__ import annotations

import socket
import sys
import types

import paramiko
import pytest

from fleetgen.airflow import node_shell
from fleetgen.airflow.node_shell import NodeShell, RemoteLines
from fleetgen.errors import HostKeyMismatch, HostUnreachable, RemoteError
from fleetgen.nodes.host_keys import describe
from fleetgen.nodes.remote import quote


class Channel:
    def __init__(self, status):
        self.status, self.write_shut, self.closed = status, False, False

    def shutdown_write(self):
        self.write_shut = True

    def recv_exit_status(self):
        return self.status

    def close(self):
        self.closed = True


class ChannelFile:
    """One of exec_command's three files: reads ``data``; writes are kept."""

    def __init__(self, channel, data=b"", lines=()):
        self.channel, self.data, self.lines, self.written, self.flushed = channel, data, list(lines), [], False

    def read(self):
        return self.data

    def write(self, text):
        self.written.append(text)

    def flush(self):
        self.flushed = True

    def __iter__(self):
        return iter(self.lines)


class Client:
    """paramiko.SSHClient as NodeShell uses it; ``fail`` is raised by exec_command."""

    def __init__(self, status=0, out=b"", err=b"", fail=None, lines=()):
        self.channel = Channel(status)
        self.stdin, self.stdout = ChannelFile(self.channel), ChannelFile(self.channel, out, lines)
        self.stderr = ChannelFile(self.channel, err)
        self.fail, self.commands, self.closed, self.active = fail, [], False, True

    def exec_command(self, command, timeout=None):
        self.commands.append((command, timeout))
        if self.fail is not None:
            raise self.fail
        return self.stdin, self.stdout, self.stderr

    def get_transport(self):
        return types.SimpleNamespace(is_active=lambda: self.active)

    def close(self):
        self.closed = True


@pytest.fixture
def hooks(monkeypatch):
    """The SSH provider's hook, faked: each get_conn returns the next of ``clients`` or raises it."""
    made, clients = [], []

    class SSHHook:
        def __init__(self, ssh_conn_id, conn_timeout):
            self.ssh_conn_id, self.conn_timeout, self.conn_retry_attempts = ssh_conn_id, conn_timeout, 3
            made.append(self)

        def get_conn(self):
            outcome = clients.pop(0)
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome

    module = types.ModuleType("airflow.providers.ssh.hooks.ssh")
    module.SSHHook = SSHHook
    monkeypatch.setitem(sys.modules, "airflow.providers.ssh.hooks.ssh", module)
    return made, clients


def _fixed_key(seed: int):
    blob = bytes([seed]) * 51

    class Key:
        def get_name(self):
            return "ssh-ed25519"

        def asbytes(self):
            return blob

    return Key()


def test_a_connection_is_made_once_with_the_nodes_connection_and_no_retries_of_its_own(hooks):
    made, clients = hooks
    client = Client(out=b"ok\n")
    clients.append(client)
    shell = NodeShell("n1", "ssh_n1", conn_timeout_s=7)
    shell.run("true")
    shell.run("true")
    assert [(h.ssh_conn_id, h.conn_timeout, h.conn_retry_attempts) for h in made] == [("ssh_n1", 7, 1)]


def test_a_connection_waits_ten_seconds_by_default(hooks):
    made, clients = hooks
    clients.append(Client())
    NodeShell("n1", "ssh_n1").run("true")
    assert made[0].conn_timeout == 10


def test_a_dropped_connection_is_made_again(hooks):
    made, clients = hooks
    first, second = Client(), Client()
    clients.extend([first, second])
    shell = NodeShell("n1", "ssh_n1")
    shell.run("true")
    first.active = False
    shell.run("true")
    assert len(made) == 2 and len(second.commands) == 1


def test_a_client_without_a_transport_is_made_again(hooks):
    made, clients = hooks
    first, second = Client(), Client()
    first.get_transport = lambda: None
    clients.extend([first, second])
    shell = NodeShell("n1", "ssh_n1")
    shell.run("true")
    shell.run("true")
    assert len(made) == 2


def test_a_host_key_mismatch_is_its_own_error_with_both_fingerprints_not_an_unreachable_host(hooks):
    _, clients = hooks
    expected, received = _fixed_key(1), _fixed_key(2)
    clients.append(paramiko.BadHostKeyException("10.0.0.6", received, expected))
    with pytest.raises(HostKeyMismatch) as mismatch:
        NodeShell("n1", "ssh_n1").run("true")
    error = mismatch.value
    assert error.expected == describe("ssh-ed25519", expected.asbytes())
    assert error.received == describe("ssh-ed25519", received.asbytes())
    assert error.expected != error.received and error.host == "n1"
    assert "the host key of 10.0.0.6 does not match connection 'ssh_n1'" in str(error)
    assert error.__suppress_context__


def test_an_ssh_protocol_failure_names_the_connection(hooks):
    _, clients = hooks
    clients.append(paramiko.SSHException("Error reading SSH protocol banner"))
    with pytest.raises(HostUnreachable, match="SSH to node failed via connection 'ssh_n1': Error reading SSH") as e:
        NodeShell("n1", "ssh_n1").run("true")
    assert type(e.value) is HostUnreachable and e.value.host == "n1"
    assert e.value.hint == "check the connection's host key, login and key file"


@pytest.mark.parametrize("refusal", [paramiko.AuthenticationException("Authentication failed."),
                                     paramiko.PasswordRequiredException("Private key file is encrypted")])
def test_a_refused_login_is_never_retried_and_names_the_connection_to_fix(hooks, refusal):
    from airflow.sdk.exceptions import AirflowFailException

    from fleetgen.airflow.context import fail_fast
    from fleetgen.errors import AuthenticationRefused

    _, clients = hooks
    clients.append(refusal)
    with pytest.raises(AirflowFailException) as failed:  # as every task callable: failed for good, no retry
        fail_fast(lambda: NodeShell("n1", "ssh_n1").run("true"))()
    error = failed.value.__cause__
    assert type(error) is AuthenticationRefused and error.host == "n1"
    assert error.message == f"the node refused the login of SSH connection 'ssh_n1': {refusal}"
    assert error.hint == ("fix the login and key_file (or private_key) of the Airflow connection 'ssh_n1', or add its "
                          "public key to ~/.ssh/authorized_keys of that login on the node; retrying cannot help")


@pytest.mark.parametrize("failure", [FileNotFoundError(2, "No such file or directory", "/keys/id_ed25519"),
                                     PermissionError(13, "Permission denied", "/keys/id_ed25519"),
                                     IsADirectoryError(21, "Is a directory", "/keys/id_ed25519")])
def test_a_key_file_that_cannot_be_read_is_configuration_naming_the_file_and_the_connection(hooks, failure):
    from fleetgen.errors import ConfigError

    _, clients = hooks
    clients.append(failure)
    with pytest.raises(ConfigError) as failed:
        NodeShell("n1", "ssh_n1").run("true")
    error = failed.value
    assert (error.host, error.path) == ("n1", "/keys/id_ed25519")
    assert error.message == (f"the key file /keys/id_ed25519 of SSH connection 'ssh_n1' cannot be read on this "
                             f"machine: {failure.strerror}")
    assert error.hint == ("fix key_file in the extra of the Airflow connection 'ssh_n1', or put the private key "
                          "there, readable by the user the workers and the triggerer run as")


@pytest.mark.parametrize("failure, shown", [(ConnectionRefusedError("refused"), "ConnectionRefusedError: refused"),
                                            (socket.timeout("timed out"), "TimeoutError: timed out")])
def test_an_unreachable_node_names_the_connection_and_the_network_error(hooks, failure, shown):
    _, clients = hooks
    clients.append(failure)
    with pytest.raises(HostUnreachable, match=f"cannot reach the node via connection 'ssh_n1': {shown}") as e:
        NodeShell("n1", "ssh_n1").run("true")
    assert e.value.hint == "is the node up and its SSH port open from this worker?" and e.value.host == "n1"


def test_a_misconfigured_connection_is_an_unreachable_host_naming_it(hooks):
    _, clients = hooks
    clients.append(ValueError("The conn_id `ssh_n1` isn't defined"))
    with pytest.raises(HostUnreachable, match="cannot open SSH connection 'ssh_n1': The conn_id") as e:
        NodeShell("n1", "ssh_n1").run("true")
    assert e.value.hint == "check the Airflow connection (host, port, login, key_file, host_key)"
    assert e.value.host == "n1"


def test_a_command_runs_under_bash_with_its_timeout_and_returns_status_and_text(hooks, monkeypatch, caplog):
    _, clients = hooks
    client = Client(status=0, out="héllo\n".encode() + b"\xff", err=b"\xfewarn\n")
    clients.append(client)
    clock = iter([10.0, 12.5])
    monkeypatch.setattr(node_shell.time, "monotonic", lambda: next(clock))
    with caplog.at_level("DEBUG", logger=node_shell.__name__):
        assert NodeShell("n0", "ssh_n0").run("echo 'a b'", timeout_s=33, describe="greeting") == \
            (0, "héllo\n\ufffd", "\ufffdwarn\n")
    assert client.commands == [("bash -c " + quote("echo 'a b'"), 33)]
    assert [r.getMessage() for r in caplog.records] == ["greeting on n0 took 2.50 s (exit 0)"]
    assert client.stdin.written == [] and client.channel.write_shut


def test_stdin_is_written_and_flushed_before_the_input_is_closed(hooks):
    _, clients = hooks
    client = Client()
    clients.append(client)
    NodeShell("n0", "ssh_n0").run("cat > f", stdin="api-key: s3cret\n")
    assert client.stdin.written == ["api-key: s3cret\n"] and client.stdin.flushed and client.channel.write_shut


def test_a_failed_command_is_a_remote_error_with_the_end_of_its_stderr(hooks):
    _, clients = hooks
    clients.append(Client(status=3, out=b"out", err=b"e" * 3000 + b"the reason\n"))
    with pytest.raises(RemoteError, match=r"launch failed with exit status 3: e+the reason$") as failed:
        NodeShell("n0", "ssh_n0").run("x", describe="launch")
    assert len(str(failed.value).split(": ", 1)[1]) == 2000 and failed.value.host == "n0"


def test_a_failed_command_without_stderr_shows_the_end_of_its_output(hooks):
    _, clients = hooks
    clients.append(Client(status=1, out=b"o" * 3000 + b"what went wrong\n", err=b"  \n"))
    with pytest.raises(RemoteError, match="probe failed with exit status 1: o+what went wrong$") as failed:
        NodeShell("n0", "ssh_n0").run("x", describe="probe")
    assert len(str(failed.value).split("exit status 1: ", 1)[1]) == 2000


def test_a_command_without_a_description_or_timeout_is_a_command_of_two_minutes(hooks):
    _, clients = hooks
    client = Client(status=2)
    clients.append(client)
    with pytest.raises(RemoteError, match=r"\] command failed with exit status 2"):
        NodeShell("n0", "ssh_n0").run("x")
    assert client.commands[0][1] == 120.0


def test_an_unchecked_command_returns_its_exit_status(hooks):
    _, clients = hooks
    clients.append(Client(status=4, out=b"", err=b"cannot read"))
    assert NodeShell("n0", "ssh_n0").run("x", check=False) == (4, "", "cannot read")


@pytest.mark.parametrize("failure", [socket.timeout("timed out"), TimeoutError()])
def test_a_command_that_outlives_its_timeout_is_a_remote_error_not_a_lost_node(hooks, failure):
    _, clients = hooks
    clients.append(Client(fail=failure))
    with pytest.raises(RemoteError, match="probe did not finish within 61 s") as late:
        NodeShell("n0", "ssh_n0").run("x", describe="probe", timeout_s=60.6)
    assert type(late.value) is RemoteError and late.value.host == "n0"


def test_a_connection_lost_during_a_command_is_an_unreachable_host(hooks):
    _, clients = hooks
    clients.append(Client(fail=OSError("Socket is closed")))
    with pytest.raises(HostUnreachable, match="connection lost during launch of n0:30000: Socket is closed") as lost:
        NodeShell("n0", "ssh_n0").run("x", describe="launch of n0:30000")
    assert lost.value.host == "n0"


def test_a_stream_yields_text_lines_and_its_close_ends_the_session_and_the_connection(hooks):
    _, clients = hooks
    client = Client(lines=[b"one\n", "two\n", b"\xffthree"])
    clients.append(client)
    shell = NodeShell("n0", "ssh_n0")
    lines = shell.stream("nvidia-smi -l 1", describe="GPU sampling")
    assert list(lines) == ["one", "two", "\ufffdthree"]
    assert client.commands == [("bash -c " + quote("nvidia-smi -l 1"), None)]
    lines.close()
    assert client.channel.closed and client.closed and shell._client is None


def test_a_stream_that_cannot_start_is_an_unreachable_host(hooks):
    _, clients = hooks
    clients.append(Client(fail=OSError("Socket is closed")))
    with pytest.raises(HostUnreachable, match="connection lost starting GPU sampling on n0: Socket is closed") as e:
        NodeShell("n0", "ssh_n0").stream("x", describe="GPU sampling on n0")
    assert e.value.host == "n0"
    clients.append(Client(fail=OSError("Socket is closed")))
    with pytest.raises(HostUnreachable, match="connection lost starting command: "):
        NodeShell("n0", "ssh_n0").stream("x")


def test_leaving_the_with_block_closes_the_connection_and_closing_twice_is_harmless(hooks):
    _, clients = hooks
    client = Client()
    clients.append(client)
    with NodeShell("n0", "ssh_n0") as shell:
        shell.run("true")
    assert client.closed and shell._client is None
    shell.close()
    NodeShell("n0", "ssh_n0").close()  # never connected


def test_remote_lines_strip_only_the_line_end():
    channel = Channel(0)
    lines = RemoteLines(ChannelFile(channel, lines=["  a b  \n", "\n", "GPU-X\n", b"XX\n"]), NodeShell("n0", "c"))
    assert list(lines) == ["  a b  ", "", "GPU-X", "XX"]


def test_the_mismatch_error_carries_its_hint_and_fingerprints():
    error = node_shell.host_key_mismatch("n0", "ssh_n0", "10.0.0.5", expected="E", received="R")
    assert isinstance(error, HostKeyMismatch) and (error.expected, error.received, error.host) == ("E", "R", "n0")
    assert "] the host key of 10.0.0.5 does not match connection 'ssh_n0': expected E, received R" in str(error)
    assert error.hint == ("someone may be impersonating the node, or it was reinstalled: compare the received "
                          "fingerprint with `ssh-keygen -lf` of the node's host key, then update the connection's "
                          "host_key extra")
