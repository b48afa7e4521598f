"""Ports for the simulated fleet and the production stack: picked now, bound minutes later by a server
that a DAG run launches, so two picks must never overlap and no outgoing connection may take one meanwhile."""

import socket

from devstack.demo import _ephemeral_floor, free_port_block


def test_blocks_handed_out_never_overlap_even_from_the_same_start():
    first = free_port_block(4, start=21000)
    second = free_port_block(2, start=21000)
    assert set(range(first, first + 4)).isdisjoint(range(second, second + 2))


def test_random_blocks_lie_below_the_kernels_ephemeral_range():
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
