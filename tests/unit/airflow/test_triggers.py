"""ReadinessTrigger's wait, driven through loopback fakes: a scripted SSH node (one outcome per poll), HTTP answered
by httpx's MockTransport, and a clock that moves only when the trigger sleeps.

What each poll's outcome decides: a drop is reconnected within a budget that a good poll renews, a host key
mismatch is never retried, a connection that cannot even be set up fails at once, a dead server fails with its line,
and a server ready over HTTP ends the wait even while its node's SSH is away."""

import asyncio
import json
from dataclasses import dataclass, field, fields
from types import SimpleNamespace

import asyncssh
import httpx
import pytest

from fleetgen.airflow import triggers
from fleetgen.airflow.triggers import LOG_TAIL_LINES, ConnectionSetupError, ReadinessTrigger, WatchSettings
from fleetgen.errors import FailureKind
from fleetgen.nodes import remote
from fleetgen.nodes.host_keys import describe, describe_public_line
from fleetgen.nodes.remote import ALIVE_MARK
from fleetgen.nodes.reconnect import DEFAULT_RECONNECT_ATTEMPTS

SERVER = {"node": "node0", "name": "node0:30000", "url": "http://10.0.0.7:30000", "port": 30000, "gpu_ids": [0]}
LOAD_LINE = "[2026-12-01 14:51:26] Load weight begin. avail mem=21.60 GB"
OOM_LINE = "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static"
SERVER_INFO = {"max_total_num_tokens": 65536, "version": "0.5.23"}
MODEL_INFO = {"served_model_name": "tonight"}


class Clock:
    """The trigger module's time and asyncio.sleep: time passes only when the trigger sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@dataclass
class Step:
    """One poll's outcome. ``error`` is raised by the first SSH call of the poll (the reconnect when the
    connection is down, else the watch command); ``http_ready``: the server answers /health and /server_info."""
    error: BaseException | None = None
    alive: bool = True
    lines: list[str] = field(default_factory=list)
    http_ready: bool = False
    stdout: str | bytes | None = None   # the watch command's raw output, when not built from alive and lines


class Connection:
    def __init__(self, node: "Node") -> None:
        self.node = node
        self.closed = False

    async def run(self, command, check=False):
        self.node.commands.append((command, check))
        step = self.node.take()
        if step.error is not None:
            raise step.error
        stdout = step.stdout
        if stdout is None:
            stdout = "".join(f"{line}\n" for line in step.lines) + f"{ALIVE_MARK}{int(step.alive)}\n"
        return SimpleNamespace(stdout=stdout, exit_status=0)

    def close(self) -> None:
        self.closed = True


class Node:
    """A node and its server, scripted one Step per poll."""

    def __init__(self, *steps: Step) -> None:
        self.steps = list(steps)
        self.current: Step | None = None
        self.connections: list[Connection] = []
        self.commands: list[tuple[str, bool]] = []
        self.requests: list[httpx.Request] = []

    def take(self) -> Step:
        if not self.steps:
            raise AssertionError("the trigger polled past the end of the script")
        self.current = self.steps.pop(0)
        return self.current

    async def connect(self) -> Connection:
        if self.steps and self.steps[0].error is not None:
            raise self.take().error
        connection = Connection(self)
        self.connections.append(connection)
        return connection

    def answer(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if not (self.current and self.current.http_ready):
            return httpx.Response(503)
        body = {"/health": {}, "/model_info": MODEL_INFO, "/server_info": SERVER_INFO}[request.url.path]
        return httpx.Response(200, json=body)


class Log:
    def __init__(self) -> None:
        self.warnings: list[str] = []
        self.infos: list[str] = []

    def warning(self, message, *args):
        self.warnings.append(message % args)

    def info(self, message, *args):
        self.infos.append(message % args)


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(triggers, "time", clock)
    monkeypatch.setattr(triggers, "asyncio", SimpleNamespace(sleep=clock.sleep, wait_for=asyncio.wait_for,
                                                             to_thread=asyncio.to_thread))
    return clock


class Clients:
    """Every HTTP client the trigger opens (its arguments), each answered by the node of the test."""

    def __init__(self) -> None:
        self.opened: list[dict] = []
        self.node: Node | None = None
        self.real_client = httpx.AsyncClient

    def __call__(self, **kwargs) -> httpx.AsyncClient:
        self.opened.append(kwargs)
        return self.real_client(transport=httpx.MockTransport(self.node.answer), **kwargs)


@pytest.fixture
def clients(monkeypatch) -> Clients:
    clients = Clients()
    monkeypatch.setattr(httpx, "AsyncClient", clients)
    return clients


def _trigger(clock: Clock, node: Node, **kwargs) -> ReadinessTrigger:
    """A trigger on ``node``; keyword arguments named like a WatchSettings field go into its watch settings."""
    watched = {item.name for item in fields(WatchSettings)}
    watch = {"timeout_s": 600, "poll_s": 1.0, "resume_settle_s": 0.0,
             **{name: value for name, value in kwargs.items() if name in watched}}
    others = {"started_at": clock.now, **{name: value for name, value in kwargs.items() if name not in watched}}
    trigger = ReadinessTrigger(server=SERVER, ssh_conn_id="node0", log_path="/tmp/s.log", pid=4242, watch=watch,
                               **others)
    trigger._connect = node.connect
    trigger._log = Log()
    return trigger


def _wait(clock: Clock, clients, node: Node, **kwargs) -> tuple[dict, ReadinessTrigger]:
    trigger = _trigger(clock, node, **kwargs)
    clients.node = node

    async def first_event():
        events = [event.payload async for event in trigger.run()]
        assert len(events) == 1
        return events[0]

    return asyncio.run(first_event()), trigger


def _alive(**kwargs) -> Step:
    return Step(**kwargs)


def _drop(error: BaseException | None = None, **kwargs) -> Step:
    return Step(error=error or ConnectionResetError(104, "Connection reset by peer"), **kwargs)


# --- the reconnect budget ---------------------------------------------------------------------------------------

def test_a_good_poll_gives_the_next_drop_a_fresh_budget(clock, clients):
    """drop, drop (the whole budget), recovery, drop, drop: the second outage starts again from reconnect 1."""
    node = Node(_drop(), _drop(), _alive(), _drop(), _drop(), _alive(http_ready=True))
    event, trigger = _wait(clock, clients, node, reconnect_attempts=2)
    assert event["status"] == "ready"
    reconnects = [line.split(": reconnect ")[1].split(" in ")[0] for line in trigger._log.warnings]
    assert reconnects == ["1 of 2", "2 of 2", "1 of 2", "2 of 2"]
    assert len(node.connections) == 2  # the recovery's, dropped by its next poll; the last one's


def test_one_drop_more_than_the_budget_ends_the_wait_unreachable(clock, clients):
    node = Node(_alive(lines=["loading shard 3 of 12"]), _drop(OSError("first")), _drop(TimeoutError()),
                _drop(ConnectionRefusedError(111, "Connection refused")))
    event, trigger = _wait(clock, clients, node, reconnect_attempts=2, reconnect_budget_s=300)
    assert event["status"] == "unreachable"
    spent = clock.sleeps[1] + clock.sleeps[2]  # the two reconnect pauses after the poll's own pause
    assert event["budget"] == {"attempts": 2, "seconds": 300.0, "failures": 3, "spent_s": round(spent, 1)}
    assert event["error"] == (
        f"lost SSH to node0 while waiting for node0:30000 and could not reconnect: 3 failed connection(s) over "
        f"{spent:.0f} s (budget: 2 reconnects, 300 s); last error: ConnectionRefusedError: [Errno 111] "
        f"Connection refused")
    assert event["log_tail"] == ["loading shard 3 of 12"]  # what the log said last, before SSH went away
    assert len(trigger._log.warnings) == 2 and not node.steps


def test_exactly_the_budgets_reconnects_then_a_recovery_is_still_a_wait(clock, clients):
    node = Node(*[_drop() for _ in range(3)], _alive(http_ready=True))
    event, _ = _wait(clock, clients, node, reconnect_attempts=3)
    assert event["status"] == "ready"


def test_no_reconnect_at_all_with_a_budget_of_zero(clock, clients):
    event, trigger = _wait(clock, clients, Node(_drop()), reconnect_attempts=0)
    assert event["status"] == "unreachable" and event["budget"]["failures"] == 1
    assert trigger._log.warnings == [] and clock.sleeps == [] and event["log_tail"] == []  # nothing read yet


def test_the_time_budget_ends_the_wait_before_the_attempts_do(clock, clients):
    node = Node(*[_drop() for _ in range(10)])
    event, _ = _wait(clock, clients, node, reconnect_attempts=100, reconnect_budget_s=5)
    assert event["status"] == "unreachable" and event["budget"]["spent_s"] == 5.0
    assert sum(clock.sleeps) == pytest.approx(5.0) and event["budget"]["failures"] < 10


def test_a_bare_timeout_is_named_without_a_dangling_colon(clock, clients):
    event, _ = _wait(clock, clients, Node(_drop(TimeoutError())), reconnect_attempts=0)
    assert event["error"].endswith("; last error: TimeoutError")


def test_each_reconnect_is_logged_with_the_host_the_server_the_cause_and_the_budget(clock, clients):
    node = Node(_drop(OSError("Network is unreachable")), _drop(), _alive(http_ready=True))
    _, trigger = _wait(clock, clients, node, reconnect_attempts=8, reconnect_budget_s=300)
    first, second = trigger._log.warnings
    assert first == (f"SSH to node0 lost while waiting for node0:30000 (OSError: Network is unreachable): "
                     f"reconnect 1 of 8 in {clock.sleeps[0]:.1f} s, 0 of 300 s of the reconnect budget spent")
    assert f"reconnect 2 of 8 in {clock.sleeps[1]:.1f} s, {clock.sleeps[0]:.0f} of 300 s" in second


def test_reconnects_back_off_and_polls_keep_their_pace(clock, clients):
    node = Node(_alive(), _drop(), _drop(), _drop(), _alive(), _alive(http_ready=True))
    _wait(clock, clients, node, poll_s=2.5)
    poll, first, second, third, after = clock.sleeps
    assert (poll, after) == (2.5, 2.5)
    assert 1.0 <= first <= 1.5 and 2.0 <= second <= 3.0 and 4.0 <= third <= 6.0


def test_a_broken_connection_is_closed_and_replaced(clock, clients):
    node = Node(_alive(), _drop(), _alive(http_ready=True))
    _wait(clock, clients, node)
    first, second = node.connections
    assert first.closed and second.closed  # the second when the wait ended
    assert [command for command, _ in node.commands].count(remote.watch_command("/tmp/s.log", 4242, 50)) == 3


def test_one_connection_serves_every_poll_while_it_holds(clock, clients):
    node = Node(_alive(), _alive(), _alive(http_ready=True))
    _wait(clock, clients, node)
    assert len(node.connections) == 1 and node.connections[0].closed


def test_a_connection_that_fails_to_close_is_still_dropped():
    class Broken:
        def close(self):
            raise OSError("already gone")

    assert ReadinessTrigger._drop(Broken()) is None and ReadinessTrigger._drop(None) is None


# --- which clause takes which error -----------------------------------------------------------------------------

def test_a_host_key_mismatch_is_never_retried(clock, clients, monkeypatch):
    mismatch = asyncssh.HostKeyNotVerifiable("Host key is not trusted for host 10.0.0.7")
    _host_key_fakes(monkeypatch, configured=None, presented=None)
    node = Node(_alive(), _drop(), Step(error=mismatch))
    event, trigger = _wait(clock, clients, node, reconnect_attempts=8)
    assert event["status"] == "host_key_mismatch" and event["error"] == str(mismatch)
    assert len(trigger._log.warnings) == 1 and not node.steps  # the drop before it was reconnected, once


def test_a_refused_login_is_never_retried(clock, clients):
    denied = asyncssh.PermissionDenied("Permission denied for user fleet on host 10.0.0.7")
    node = Node(_alive(lines=["booting"]), _drop(), Step(error=denied))
    event, trigger = _wait(clock, clients, node, reconnect_attempts=8)
    assert event["status"] == "ssh_credentials" and "key_file" not in event
    assert event["error"] == "Permission denied for user fleet on host 10.0.0.7" and event["log_tail"] == ["booting"]
    assert len(trigger._log.warnings) == 1 and not node.steps  # only the drop before it was reconnected


@pytest.mark.parametrize("error", [FileNotFoundError(2, "No such file or directory", "/keys/id_ed25519"),
                                   PermissionError(13, "Permission denied", "/keys/id_ed25519"),
                                   IsADirectoryError(21, "Is a directory", "/keys/id_ed25519")])
def test_a_key_file_that_cannot_be_read_is_never_retried_and_named(clock, clients, error):
    event, trigger = _wait(clock, clients, Node(Step(error=error)), reconnect_attempts=8)
    assert (event["status"], event["key_file"], event["error"]) == ("ssh_credentials", "/keys/id_ed25519",
                                                                     error.strerror)
    assert trigger._log.warnings == []


@pytest.mark.parametrize("error", [ConnectionRefusedError(111, "Connection refused"), TimeoutError(),
                                   asyncssh.ConnectionLost("Connection lost"),
                                   asyncssh.ChannelOpenError(2, "open failed")])
def test_a_refused_or_lost_connection_is_reconnected(clock, clients, error):
    event, trigger = _wait(clock, clients, Node(_alive(), Step(error=error), _alive(http_ready=True)))
    assert event["status"] == "ready" and len(trigger._log.warnings) == 1
    assert type(error).__name__ in trigger._log.warnings[0]


def test_a_watch_cut_short_is_a_lost_connection_not_a_dead_server(clock, clients):
    node = Node(Step(stdout="partial tail\n"), _alive(http_ready=True))
    event, trigger = _wait(clock, clients, node)
    assert event["status"] == "ready"
    assert "ConnectionError: the log/alive check printed no verdict (exit 0)" in trigger._log.warnings[0]


def test_a_watch_cut_short_keeps_the_last_full_tail(clock, clients):
    node = Node(_alive(lines=["loading shard 7 of 12"]), Step(stdout="loading sh"), Step(stdout=""), _drop())
    event, _ = _wait(clock, clients, node, reconnect_attempts=2)
    assert event["status"] == "unreachable" and event["log_tail"] == ["loading shard 7 of 12"]


def test_a_connection_that_cannot_be_set_up_fails_at_once(clock, clients):
    setup = ConnectionSetupError("cannot open SSH connection 'node0': AirflowNotFoundException: no conn")
    node = Node(_alive(lines=["booting"]), _drop(), Step(error=setup))
    event, trigger = _wait(clock, clients, node, reconnect_attempts=8)
    assert event["status"] == "unreachable" and event["error"] == str(setup) and "budget" not in event
    assert event["log_tail"] == ["booting"] and len(trigger._log.warnings) == 1 and not node.steps


class FakeHook:
    made: list[str] = []
    outcome: object = None

    def __init__(self, ssh_conn_id):
        FakeHook.made.append(ssh_conn_id)

    async def get_conn(self):
        if isinstance(FakeHook.outcome, BaseException):
            raise FakeHook.outcome
        if FakeHook.outcome == "hang":
            await asyncio.Event().wait()
        return FakeHook.outcome


def _connect_with(monkeypatch, outcome, command_timeout_s=5.0):
    from airflow.providers.ssh.hooks import ssh

    FakeHook.made, FakeHook.outcome = [], outcome
    monkeypatch.setattr(ssh, "SSHHookAsync", FakeHook)
    trigger = ReadinessTrigger(server=SERVER, ssh_conn_id="node0", log_path="/x", pid=1, 
                               watch={"timeout_s": 600, "command_timeout_s": command_timeout_s})
    return asyncio.run(trigger._connect())


def test_connect_opens_the_named_connection(monkeypatch):
    connection = object()
    assert _connect_with(monkeypatch, connection) is connection and FakeHook.made == ["node0"]


@pytest.mark.parametrize("error", [asyncssh.HostKeyNotVerifiable("not trusted"), asyncssh.PermissionDenied("no"),
                                   ConnectionRefusedError(111, "refused"), TimeoutError("slow")])
def test_connect_passes_connection_errors_through_as_they_are(monkeypatch, error):
    with pytest.raises(type(error)) as raised:
        _connect_with(monkeypatch, error)
    assert raised.value is error


def test_a_connect_that_hangs_times_out_within_the_command_timeout(monkeypatch):
    with pytest.raises(TimeoutError):
        _connect_with(monkeypatch, "hang", command_timeout_s=0.05)


@pytest.mark.parametrize("error", [KeyError("node0"), ValueError("not a valid OpenSSH public key")])
def test_connect_turns_any_other_error_into_a_setup_error(monkeypatch, error):
    with pytest.raises(ConnectionSetupError) as raised:
        _connect_with(monkeypatch, error)
    assert str(raised.value) == f"cannot open SSH connection 'node0': {type(error).__name__}: {error}"
    assert raised.value.__cause__ is error


# --- the host key mismatch event --------------------------------------------------------------------------------

def _host_key_fakes(monkeypatch, *, configured, presented, port=None, read_error=None) -> list:
    from airflow.sdk import BaseHook

    asked: list = []
    connection = SimpleNamespace(host="10.0.0.7", port=port,
                                 extra_dejson={"host_key": configured} if configured else {})
    monkeypatch.setattr(BaseHook, "get_connection", lambda conn_id: asked.append(conn_id) or connection)

    async def server_host_key(host, port):
        asked.append((host, port))
        if read_error is not None:
            raise read_error
        return presented

    monkeypatch.setattr(asyncssh, "get_server_host_key", server_host_key)
    return asked


def _host_key_event(**kwargs) -> dict:
    trigger = ReadinessTrigger(server=SERVER, ssh_conn_id="node0", log_path="/x", pid=1, watch={"timeout_s": 600},
                               context={"launched": {}, "attempt": 0})
    return asyncio.run(trigger._host_key_event(asyncssh.HostKeyNotVerifiable("Host key is not trusted"))).payload


def test_the_mismatch_names_the_configured_key_and_the_one_presented(monkeypatch):
    configured = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode()
    presented = asyncssh.generate_private_key("ssh-ed25519").convert_to_public()
    asked = _host_key_fakes(monkeypatch, configured=configured, presented=presented, port=2222)
    event = _host_key_event()
    assert event["status"] == "host_key_mismatch" and event["address"] == "10.0.0.7"
    assert event["expected"] == describe_public_line(configured)
    assert event["received"] == describe(presented.get_algorithm(), presented.public_data)
    assert event["received"] != event["expected"] and event["error"] == "Host key is not trusted"
    assert asked == ["node0", ("10.0.0.7", 2222)]


def test_without_a_configured_key_known_hosts_is_what_was_expected(monkeypatch):
    asked = _host_key_fakes(monkeypatch, configured=None, presented=None)
    event = _host_key_event()
    assert event["expected"] == "a key from ~/.ssh/known_hosts" and event["received"] == "(no host key)"
    assert asked[1] == ("10.0.0.7", 22)  # no port on the connection: SSH's own


@pytest.mark.parametrize("error", [OSError("refused"), asyncssh.ConnectionLost("lost"), TimeoutError("slow")])
def test_a_key_that_cannot_be_read_again_still_gives_the_mismatch(monkeypatch, error):
    _host_key_fakes(monkeypatch, configured=None, presented=None, read_error=error)
    assert _host_key_event()["received"] == f"(could not be read again: {error})"


def test_a_key_read_that_hangs_gives_up_within_the_command_timeout(monkeypatch):
    _host_key_fakes(monkeypatch, configured=None, presented=None)

    async def hangs(host, port):
        await asyncio.Event().wait()

    monkeypatch.setattr(asyncssh, "get_server_host_key", hangs)
    trigger = ReadinessTrigger(server=SERVER, ssh_conn_id="node0", log_path="/x", pid=1, 
                               watch={"timeout_s": 600, "command_timeout_s": 0.05})
    event = asyncio.run(trigger._host_key_event(asyncssh.HostKeyNotVerifiable("not trusted"))).payload
    assert event["status"] == "host_key_mismatch" and event["received"].startswith("(could not be read again")


# --- each poll's verdict ----------------------------------------------------------------------------------------

def _poll(step: Step, *, http_ready: bool = False, **kwargs):
    node = Node(step)
    trigger = ReadinessTrigger(server=SERVER, ssh_conn_id="node0", log_path="/tmp/s.log", pid=4242, watch={"timeout_s": 600},
                               **kwargs)

    async def probe(http):
        return {"version": "0.5.23"} if http_ready else None

    trigger._probe_http = probe
    event = asyncio.run(trigger._poll(Connection(node), None))
    return (event.payload if event is not None else None), node


def test_the_poll_reads_the_tail_and_the_pid_of_this_server():
    _, node = _poll(_alive())
    assert node.commands == [(remote.watch_command("/tmp/s.log", 4242, LOG_TAIL_LINES), False)]
    assert LOG_TAIL_LINES == 50


def test_a_fatal_line_ends_the_wait_with_its_kind_and_line():
    event, _ = _poll(_alive(lines=["loading", OOM_LINE], alive=True), http_ready=True)
    assert (event["status"], event["kind"], event["fatal_line"]) == ("fatal", "oom_kv", OOM_LINE)
    assert event["log_tail"] == ["loading", OOM_LINE]


def test_a_dead_process_with_its_fatal_line_reports_the_line_not_just_the_exit():
    event, _ = _poll(_alive(lines=[OOM_LINE], alive=False))
    assert event["kind"] == "oom_kv" and event["fatal_line"] == OOM_LINE


def test_a_process_gone_without_a_line_is_an_exit():
    event, _ = _poll(_alive(lines=["loading shard 1"], alive=False), http_ready=True)
    assert (event["status"], event["kind"]) == ("fatal", FailureKind.EXITED.value)
    assert event["fatal_line"] == "the server process exited without a recognised error line"
    assert event["log_tail"] == ["loading shard 1"]


def test_a_live_server_not_answering_yet_is_no_verdict():
    assert _poll(_alive(lines=["loading"]))[0] is None


def test_a_live_server_answering_is_ready_with_its_limits():
    event, _ = _poll(_alive(lines=[LOAD_LINE, *[f"line {n}" for n in range(9)]]), http_ready=True)
    assert event["status"] == "ready" and event["server_info"] == {"version": "0.5.23"}
    assert event["log_tail"] == [LOAD_LINE, "line 4", "line 5", "line 6", "line 7", "line 8"]


def test_of_two_load_lines_in_one_tail_only_the_newest_is_kept():
    """A relaunch into the same log: the first launch's memory line must not feed the calibration."""
    second = LOAD_LINE.replace("21.60", "20.10")
    lines = [LOAD_LINE, "first launch died", second, *[f"line {n}" for n in range(6)]]
    event, _ = _poll(_alive(lines=lines), http_ready=True)
    assert event["log_tail"] == [second, "line 1", "line 2", "line 3", "line 4", "line 5"]


def test_the_watch_output_as_bytes_is_decoded_even_when_broken():
    event, _ = _poll(Step(stdout=b"caf\xe9 " + OOM_LINE.encode() + f"\n{ALIVE_MARK}1\n".encode()))
    assert event["fatal_line"] == "caf\ufffd " + OOM_LINE


def test_a_watch_without_output_is_no_verdict_on_the_server():
    trigger = ReadinessTrigger(server=SERVER, ssh_conn_id="node0", log_path="/x", pid=1, watch={"timeout_s": 600})

    class Silent:
        async def run(self, command, check=False):
            return SimpleNamespace(stdout=None, exit_status=137)

    with pytest.raises(ConnectionError, match=r"printed no verdict \(exit 137\)"):
        asyncio.run(trigger._poll(Silent(), None))


def test_a_wedged_watch_command_times_out():
    trigger = ReadinessTrigger(server=SERVER, ssh_conn_id="node0", log_path="/x", pid=1, 
                               watch={"timeout_s": 600, "command_timeout_s": 0.05})

    class Wedged:
        async def run(self, command, check=False):
            await asyncio.Event().wait()

    with pytest.raises(TimeoutError):
        asyncio.run(trigger._poll(Wedged(), None))


# --- the wait as a whole ----------------------------------------------------------------------------------------

def test_a_server_ready_while_ssh_is_away_ends_the_wait_ready(clock, clients):
    node = Node(_alive(lines=[LOAD_LINE, "loading"]), _drop(http_ready=True))
    event, _ = _wait(clock, clients, node)
    assert event["status"] == "ready" and event["server_info"]["max_total_num_tokens"] == 65536
    assert event["log_tail"] == [LOAD_LINE, LOAD_LINE, "loading"]  # the load line kept, then the last tail
    assert len(node.connections) == 1


def test_every_event_says_which_server_launch_and_wait_it_ends(clock, clients):
    context = {"launched": {"name": "node0:30000", "pid": 4242}, "attempt": 1}
    event, _ = _wait(clock, clients, Node(_alive(http_ready=True)), started_at=clock.now - 12.34, context=context)
    assert (event["server"], event["log_path"], event["pid"]) == (SERVER, "/tmp/s.log", 4242)
    assert event["context"] == context and event["waited_s"] == 12.3


def test_the_wait_times_out_only_after_more_than_the_timeout(clock, clients):
    node = Node(*[_alive(lines=["still loading"]) for _ in range(5)])
    event, _ = _wait(clock, clients, node, timeout_s=3, poll_s=1.0)
    assert event["status"] == "timeout" and event["waited_s"] == 4.0 and event["log_tail"] == ["still loading"]
    assert not node.steps  # polled at 0, 1, 2, 3 s (not over yet) and 4 s


def test_a_timeout_counts_from_when_the_launch_started_not_from_the_trigger(clock, clients):
    event, _ = _wait(clock, clients, Node(_alive()), timeout_s=600, started_at=clock.now - 600.5)
    assert event["status"] == "timeout" and event["waited_s"] == 600.5


def test_a_verdict_at_the_deadline_wins_over_the_timeout(clock, clients):
    event, _ = _wait(clock, clients, Node(_alive(http_ready=True)), timeout_s=1, started_at=clock.now - 5)
    assert event["status"] == "ready" and event["waited_s"] == 5.0


def test_a_hold_under_a_second_is_still_held_and_logged(clock, clients):
    event, trigger = _wait(clock, clients, Node(_alive(http_ready=True)), resume_settle_s=0.5)
    assert event["status"] == "ready" and clock.sleeps == [0.5]
    assert trigger._log.infos == ["node0:30000: holding the event 0.5 s so the task resumes after Airflow has seen "
                                  "it defer"]


def test_an_event_exactly_at_the_end_of_the_hold_is_not_held_again(clock, clients):
    event, _ = _wait(clock, clients, Node(_alive(http_ready=True)), resume_settle_s=0.0)
    assert event["status"] == "ready" and clock.sleeps == []


def test_the_http_client_asks_this_servers_url_with_the_api_key(clock, clients, monkeypatch):
    from airflow.sdk import BaseHook

    monkeypatch.setattr(BaseHook, "get_connection", lambda conn_id: SimpleNamespace(password=f"key-of-{conn_id}"))
    node = Node(_alive(http_ready=True))
    _wait(clock, clients, node, api_key_conn_id="sglang_api")
    assert [str(request.url) for request in node.requests] == [
        "http://10.0.0.7:30000/health", "http://10.0.0.7:30000/model_info", "http://10.0.0.7:30000/server_info"]
    assert {request.headers["authorization"] for request in node.requests} == {"Bearer key-of-sglang_api"}
    assert clients.opened[0]["timeout"] == 5.0


def test_without_an_api_key_no_authorization_is_sent(clock, clients):
    node = Node(_alive(http_ready=True))
    _wait(clock, clients, node)
    assert all("authorization" not in request.headers for request in node.requests)


# --- /health, /model_info, /server_info -------------------------------------------------------------------------

def _probe(routes: dict, context: dict | None = None):
    asked: list[str] = []

    def answer(request):
        asked.append(request.url.path)
        response = routes.get(request.url.path, (404, None))
        if isinstance(response, Exception):
            raise response
        status, body = response
        if isinstance(body, str):
            return httpx.Response(status, text=body)
        return httpx.Response(status, json=body)

    trigger = ReadinessTrigger(server=SERVER, ssh_conn_id="node0", log_path="/x", pid=1, watch={"timeout_s": 600},
                               context=context)

    async def probe():
        async with httpx.AsyncClient(base_url=SERVER["url"], transport=httpx.MockTransport(answer)) as http:
            return await trigger._probe_http(http)

    return asyncio.run(probe()), asked


READY_ROUTES = {"/health": (200, {}), "/model_info": (200, MODEL_INFO), "/server_info": (200, SERVER_INFO)}


def test_a_ready_server_gives_its_server_info_with_its_model_info():
    info, asked = _probe(READY_ROUTES)
    assert info == {**SERVER_INFO, "_model_info": MODEL_INFO} and asked == ["/health", "/model_info", "/server_info"]


@pytest.mark.parametrize("path, status", [("/health", 503), ("/health", 201), ("/model_info", 503),
                                          ("/model_info", 204)])
def test_a_server_not_answering_200_yet_is_not_ready(path, status):
    info, asked = _probe({**READY_ROUTES, path: (status, {})})
    assert info is None and "/server_info" not in asked


def test_an_older_server_is_read_through_the_deprecated_alias():
    routes = {**READY_ROUTES, "/server_info": (404, None), "/get_server_info": (200, {"version": "0.4.9"})}
    info, asked = _probe(routes)
    assert info == {"version": "0.4.9", "_model_info": MODEL_INFO} and asked[-1] == "/get_server_info"


@pytest.mark.parametrize("routes", [
    {**READY_ROUTES, "/server_info": (500, {})},
    {**READY_ROUTES, "/server_info": (404, None), "/get_server_info": (404, None)},
    {**READY_ROUTES, "/server_info": (200, "<html>starting</html>")},
    {**READY_ROUTES, "/model_info": (200, "not json")},
    {**READY_ROUTES, "/health": httpx.ConnectError("refused")},
    {**READY_ROUTES, "/server_info": httpx.ReadTimeout("slow")},
])
def test_an_unreadable_answer_is_not_ready_and_not_a_failure(routes):
    assert _probe(routes)[0] is None


def test_a_server_running_another_launch_is_not_ready():
    args = ["--model-path", "/models/tonight", "--port", "30000"]
    mine = {**SERVER_INFO, "model_path": "/models/tonight", "port": 30000}
    assert _probe({**READY_ROUTES, "/server_info": (200, mine)}, {"launched": {"args": args}})[0] is not None
    other = {**mine, "model_path": "/models/last-week"}
    assert _probe({**READY_ROUTES, "/server_info": (200, other)}, {"launched": {"args": args}})[0] is None


def test_another_launch_on_the_port_is_warned_once_naming_the_first_three_differences():
    args = ["--model-path", "/models/tonight", "--port", "30000", "--mem-fraction-static", "0.9",
            "--context-length", "8192"]
    foreign = {**SERVER_INFO, "model_path": "/models/old", "port": 30001, "mem_fraction_static": 0.8,
               "context_length": 4096}
    trigger = ReadinessTrigger(server=SERVER, ssh_conn_id="node0", log_path="/x", pid=1, watch={"timeout_s": 600},
                               context={"launched": {"args": args}})
    trigger._log = Log()
    assert not trigger._is_this_launch(foreign) and not trigger._is_this_launch(foreign)
    assert trigger._log.warnings == [
        "node0:30000: the server answering on http://10.0.0.7:30000 does not run this launch (--model-path: running "
        "'/models/old', tonight '/models/tonight'; --port: running 30001, tonight '30000'; --mem-fraction-static: "
        "running 0.8, tonight '0.9'); waiting for ours"]


# --- what the trigger carries -----------------------------------------------------------------------------------

def test_every_setting_survives_serialisation_as_json():
    watch = {"timeout_s": "900", "poll_s": 2, "reconnect_attempts": "4", "reconnect_budget_s": 120,
             "command_timeout_s": 7, "resume_settle_s": 3}
    trigger = ReadinessTrigger(server=SERVER, ssh_conn_id="node0", log_path="/tmp/s.log", pid="4242", watch=watch,
                               api_key_conn_id="sglang_api", started_at=1234.5,
                               context={"launched": {"name": "node0:30000"}, "attempt": 3})
    classpath, kwargs = trigger.serialize()
    assert classpath == "fleetgen.airflow.triggers.ReadinessTrigger"
    assert kwargs == {"server": SERVER, "ssh_conn_id": "node0", "log_path": "/tmp/s.log", "pid": 4242,
                      "watch": {"timeout_s": 900.0, "poll_s": 2.0, "reconnect_attempts": 4,
                                "reconnect_budget_s": 120.0, "command_timeout_s": 7.0, "resume_settle_s": 3.0},
                      "api_key_conn_id": "sglang_api", "started_at": 1234.5,
                      "context": {"launched": {"name": "node0:30000"}, "attempt": 3}}
    assert json.loads(json.dumps(kwargs)) == kwargs
    assert ReadinessTrigger(**kwargs).serialize() == (classpath, kwargs)
    assert type(trigger.watch.reconnect_attempts) is int and type(trigger.watch.poll_s) is float


def test_an_unknown_watch_setting_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"unknown watch settings \['poll'\]"):
        ReadinessTrigger(server=SERVER, ssh_conn_id="n", log_path="/x", pid=1, watch={"poll": 1})


def test_a_trigger_started_at_zero_keeps_zero(clock):
    assert ReadinessTrigger(server=SERVER, ssh_conn_id="n", log_path="/x", pid=1, watch={"timeout_s": 1},
                            started_at=0.0).started_at == 0.0
    unset = ReadinessTrigger(server=SERVER, ssh_conn_id="n", log_path="/x", pid=1, watch={"timeout_s": 5})
    assert unset.started_at == clock.now and unset.context == {} and unset.watch == WatchSettings(timeout_s=5.0)
    assert unset.watch.poll_s == 1.0 and unset.watch.reconnect_attempts == DEFAULT_RECONNECT_ATTEMPTS
    assert unset.api_key_conn_id is None and asyncio.run(unset._api_headers()) == {}


def test_the_wait_has_no_timeout_of_its_own():
    with pytest.raises(ValueError, match=r"^watch settings need timeout_s \(the run's ready_timeout_s\)$"):
        WatchSettings.from_json({"poll_s": 1})


@pytest.mark.parametrize(("setting", "value", "message"), [
    ("reconnect_attempts", True, r"reconnect_attempts=True is not a number"),
    ("poll_s", None, r"poll_s=None is not a number"),
    ("poll_s", "soon", r"poll_s='soon' is not a number"),
    ("command_timeout_s", -1, r"command_timeout_s=-1 must be a finite number >= 0"),
    ("reconnect_budget_s", "nan", r"reconnect_budget_s='nan' must be a finite number >= 0"),
    ("reconnect_attempts", "2.5", r"reconnect_attempts='2.5' must be a whole number"),
])
def test_a_watch_setting_that_is_not_a_count_or_seconds_is_refused_naming_it(setting, value, message):
    with pytest.raises(ValueError, match=message):
        WatchSettings.from_json({"timeout_s": 60, setting: value})


def test_rendered_text_and_zero_are_taken_as_numbers():
    settings = WatchSettings.from_json({"timeout_s": "90", "reconnect_attempts": "3.0", "resume_settle_s": 0})
    assert settings == WatchSettings(timeout_s=90.0, reconnect_attempts=3, resume_settle_s=0.0)
    assert type(settings.reconnect_attempts) is int
