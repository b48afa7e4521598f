"""Host keys are verified: a node presenting another key than the connection's is refused, by name."""

import json
import subprocess

import pytest

pytestmark = pytest.mark.slow


def _connection(sim_env, host_key: str) -> str:
    return json.dumps({"conn_type": "ssh", "host": "127.0.0.1", "port": sim_env.ssh_ports[0], "login": sim_env.ssh_user,
                       "extra": {"key_file": str(sim_env.key_dir / "id_ed25519"), "host_key": host_key,
                                 "look_for_keys": False}})


def test_known_host_key_connects_and_a_different_one_is_refused(sim_env, monkeypatch, tmp_path):
    import asyncssh

    from fleetgen.airflow.node_shell import NodeShell
    from fleetgen.errors import HostUnreachable
    from sglang_sim.sshd import ensure_keys

    monkeypatch.setenv("AIRFLOW_CONN_NODE_GOOD", _connection(sim_env, ensure_keys(sim_env.key_dir).host_public_key))
    with NodeShell("node0", "node_good") as shell:
        assert shell.run("nvidia-smi --query-gpu=index --format=csv,noheader")[1].split() == ["0", "1"]

    impostor = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().split()
    monkeypatch.setenv("AIRFLOW_CONN_NODE_BAD", _connection(sim_env, " ".join(impostor[:2])))
    with pytest.raises(HostUnreachable) as refused, NodeShell("node0", "node_bad") as shell:
        shell.run("true")
    assert "[host node0]" in str(refused.value) and "does not match" in str(refused.value), refused.value
    # Both fingerprints, as OpenSSH prints them, so they can be compared with the node's own key.
    expected = _ssh_keygen_fingerprint(" ".join(impostor[:2]), tmp_path / "impostor.pub")
    host_public = (sim_env.key_dir / "ssh_host_ed25519_key.pub").read_text()
    received = _ssh_keygen_fingerprint(host_public, tmp_path / "host.pub")
    assert f"expected ssh-ed25519 {expected}, received ssh-ed25519 {received}" in str(refused.value)


def test_a_host_key_mismatch_fails_the_task_without_retry(sim_env, monkeypatch):
    import asyncssh

    from airflow.sdk.exceptions import AirflowFailException
    from fleetgen.airflow.node_shell import NodeShell
    from fleetgen.airflow.context import fail_fast
    from fleetgen.errors import HostKeyMismatch

    impostor = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().split()
    monkeypatch.setenv("AIRFLOW_CONN_NODE_BAD", _connection(sim_env, " ".join(impostor[:2])))

    @fail_fast  # as every task callable of the DAG
    def probe_a_node():
        with NodeShell("node0", "node_bad") as shell:
            shell.run("true")

    with pytest.raises(AirflowFailException) as failed:  # Airflow fails it for good: no retry
        probe_a_node()
    assert isinstance(failed.value.__cause__, HostKeyMismatch) and "SHA256:" in str(failed.value)


def _ssh_keygen_fingerprint(public_line: str, path) -> str:
    path.write_text(public_line.strip() + "\n")
    listed = subprocess.run(["ssh-keygen", "-lf", str(path)], capture_output=True, text=True, check=True).stdout
    return listed.split()[1]


def _connection_with_key(sim_env, key_file) -> str:
    from sglang_sim.sshd import ensure_keys

    return json.dumps({"conn_type": "ssh", "host": "127.0.0.1", "port": sim_env.ssh_ports[0], "login": sim_env.ssh_user,
                       "extra": {"key_file": str(key_file), "host_key": ensure_keys(sim_env.key_dir).host_public_key,
                                 "look_for_keys": False}})


def test_a_missing_key_file_fails_for_good_naming_the_file_and_the_connection(sim_env, monkeypatch, tmp_path):
    from airflow.sdk.exceptions import AirflowFailException
    from fleetgen.airflow.context import fail_fast
    from fleetgen.airflow.node_shell import NodeShell
    from fleetgen.errors import ConfigError

    monkeypatch.setenv("AIRFLOW_CONN_NODE_NOKEY", _connection_with_key(sim_env, tmp_path / "absent_key"))
    with pytest.raises(AirflowFailException) as failed:
        fail_fast(lambda: NodeShell("node0", "node_nokey").run("true"))()
    error = failed.value.__cause__
    assert type(error) is ConfigError and error.path == str(tmp_path / "absent_key"), error
    assert "connection 'node_nokey'" in error.message and "is the node up" not in str(error)


def test_a_key_the_node_does_not_accept_fails_for_good_naming_the_connection(sim_env, monkeypatch, tmp_path):
    import asyncssh

    from airflow.sdk.exceptions import AirflowFailException
    from fleetgen.airflow.context import fail_fast
    from fleetgen.airflow.node_shell import NodeShell
    from fleetgen.errors import AuthenticationRefused

    stranger = tmp_path / "stranger_key"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(stranger))
    stranger.chmod(0o600)
    monkeypatch.setenv("AIRFLOW_CONN_NODE_STRANGER", _connection_with_key(sim_env, stranger))
    with pytest.raises(AirflowFailException) as failed:
        fail_fast(lambda: NodeShell("node0", "node_stranger").run("true"))()
    error = failed.value.__cause__
    assert type(error) is AuthenticationRefused and "connection 'node_stranger'" in error.message, error
