"""Checkpoint write time: every node writes its shard, up to the file system's ceiling."""

from __future__ import annotations

import dataclasses

import pytest
from smplan.hwprofiles import load_cluster
from smplan.simulator.reliability import (
    checkpoint_bytes,
    checkpoint_seconds,
    checkpoint_write_gbps,
    writer_nodes,
)


def test_the_write_rate_grows_with_the_nodes_then_stops_at_the_file_system():
    cluster = load_cluster("h100x8")
    per_node, ceiling = cluster.storage.checkpoint_write_gbps, cluster.storage.filesystem_write_gbps
    assert checkpoint_write_gbps(1, cluster) == per_node
    assert checkpoint_write_gbps(8, cluster) == 8 * per_node
    saturated = int(ceiling // per_node) + 1
    assert checkpoint_write_gbps(saturated, cluster) == ceiling == checkpoint_write_gbps(10 * saturated, cluster)
    nbytes = checkpoint_bytes(175_000_000_000, "bf16")
    times = [checkpoint_seconds(nbytes, n, cluster) for n in (1, 16, 128, saturated, 4 * saturated)]
    assert times == sorted(times, reverse=True) and times[-1] == times[-2] == pytest.approx(nbytes / (ceiling * 1e9))


def test_a_profile_can_raise_the_ceiling():
    cluster = load_cluster("h100x8")
    faster = dataclasses.replace(cluster, storage=dataclasses.replace(cluster.storage, filesystem_write_gbps=1e6))
    assert checkpoint_write_gbps(1024, faster) == 1024 * cluster.storage.checkpoint_write_gbps


def test_writer_nodes_counts_a_partial_node():
    cluster = load_cluster("h100x8")
    assert [writer_nodes(w, cluster) for w in (1, 8, 9, 64)] == [1, 1, 2, 8]
