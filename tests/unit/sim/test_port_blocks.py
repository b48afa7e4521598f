"""Ports for the simulated fleet and the production stack: picked now, bound minutes later by a server
that a DAG run launches, so two picks must never overlap and no outgoing connection may take one meanwhile."""

import socket

import pytest

from devstack.demo import PORT_RANGE_ENV, _ephemeral_floor, free_port_block, port_range, worker_port_range


def test_blocks_handed_out_never_overlap_even_from_the_same_start():
    first = free_port_block(4, start=21000)
    second = free_port_block(2, start=21000)
    assert set(range(first, first + 4)).isdisjoint(range(second, second + 2))


def test_random_blocks_lie_below_the_kernels_ephemeral_range(monkeypatch):
    monkeypatch.delenv(PORT_RANGE_ENV, raising=False)
    floor = _ephemeral_floor()
    for _ in range(50):
        port = free_port_block(3)
        assert 20000 <= port and port + 3 <= floor


def test_a_bound_port_is_skipped():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        block = free_port_block(2, start=port - 1, stop=port + 50)
        assert port not in range(block, block + 2)


def test_random_blocks_lie_in_the_range_the_environment_sets(monkeypatch):
    monkeypatch.setenv(PORT_RANGE_ENV, "24000-24600")
    for _ in range(50):
        port = free_port_block(3)
        assert 24000 <= port and port + 3 <= 24600


@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_each_worker_has_its_own_part_of_the_range_below_the_ephemeral_floor(monkeypatch, workers):
    parts = []
    for index in range(workers):
        monkeypatch.setenv(PORT_RANGE_ENV, worker_port_range(index, workers))
        parts.append(port_range())
    assert parts[0][0] == 20000 and parts[-1][1] <= _ephemeral_floor()
    assert all(high <= next_low for (_, high), (next_low, _) in zip(parts, parts[1:]))
    assert all(high - low >= 1000 for low, high in parts)


@pytest.mark.parametrize("value", ["24000", "24000-", "-24000", "25000-24000", "80-9000", "a-b", "24000-70000"])
def test_a_malformed_range_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(PORT_RANGE_ENV, value)
    with pytest.raises(ValueError, match=PORT_RANGE_ENV):
        free_port_block(1)
