"""ParallelLayout: rank arithmetic, how groups lie on nodes, stage boundaries."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from smplan.hwprofiles import GroupSpan, ParallelLayout

powers = st.sampled_from([1, 2, 4, 8, 16])


@given(pp=st.integers(1, 6), dp=st.integers(1, 6), tp=st.integers(1, 6), data=st.data())
def test_rank_coords_round_trip(pp, dp, tp, data):
    layout = ParallelLayout(pp=pp, dp=dp, tp=tp, gpus_per_node=8)
    rank = data.draw(st.integers(0, layout.world_size - 1))
    assert layout.rank(**layout.coords(rank)) == rank
    c = {
        "pp": data.draw(st.integers(0, pp - 1)),
        "dp": data.draw(st.integers(0, dp - 1)),
        "tp": data.draw(st.integers(0, tp - 1)),
    }
    assert layout.coords(layout.rank(**c)) == c


@given(
    pp=powers,
    dp=powers,
    tp=powers,
    gpn=st.sampled_from([1, 2, 4, 8]),
    dim=st.sampled_from(["pp", "dp", "tp"]),
)
def test_span_matches_brute_force(pp, dp, tp, gpn, dim):
    layout = ParallelLayout(pp=pp, dp=dp, tp=tp, gpus_per_node=gpn)
    span = layout.span(dim)
    for rank in range(0, layout.world_size, max(1, layout.world_size // 7)):
        ranks = layout.group_ranks(dim, rank)
        per_node = {}
        for r in ranks:
            per_node[layout.node_of(r)] = per_node.get(layout.node_of(r), 0) + 1
        assert span.size == len(ranks)
        assert span.nodes == len(per_node)
        assert span.ranks_per_node == max(per_node.values())


def test_tp8_on_8_gpu_nodes_stays_inside_a_node():
    layout = ParallelLayout(pp=2, dp=4, tp=8, gpus_per_node=8)
    assert layout.span("tp") == GroupSpan(size=8, ranks_per_node=8)
    assert not layout.span("tp").crosses_nodes
    assert layout.group_ranks("tp", 13) == list(range(8, 16))
    # every dp and pp peer then lives on another node
    assert layout.span("dp") == GroupSpan(size=4, ranks_per_node=1)
    assert layout.span("pp") == GroupSpan(size=2, ranks_per_node=1)
    assert layout.nodes == 8


def test_dp_groups_cross_nodes():
    layout = ParallelLayout(pp=1, dp=8, tp=2, gpus_per_node=8)
    span = layout.span("dp")
    assert span == GroupSpan(size=8, ranks_per_node=4) and span.nodes == 2 and span.crosses_nodes
    assert layout.group_ranks("dp", 1) == [1, 3, 5, 7, 9, 11, 13, 15]


def test_tp_larger_than_node_crosses():
    layout = ParallelLayout(pp=1, dp=1, tp=16, gpus_per_node=8)
    assert layout.span("tp") == GroupSpan(16, 8) and layout.span("tp").crosses_nodes


def test_stage_boundary_crosses_node():
    every = ParallelLayout(pp=4, dp=1, tp=8, gpus_per_node=8)  # one stage per node
    assert all(every.stage_boundary_crosses_node(s) for s in range(4))
    none = ParallelLayout(pp=4, dp=1, tp=2, gpus_per_node=8)  # the whole pipeline in one node
    assert not any(none.stage_boundary_crosses_node(s) for s in range(4))
    half = ParallelLayout(pp=4, dp=2, tp=2, gpus_per_node=8)  # two stages per node
    assert [half.stage_boundary_crosses_node(s) for s in range(4)] == [False, True, False, True]


def test_invalid_layout_and_dim():
    with pytest.raises(ValueError, match="tp must be at least 1"):
        ParallelLayout(pp=1, dp=1, tp=0, gpus_per_node=8)
    with pytest.raises(ValueError, match="unknown mesh dimension"):
        ParallelLayout(pp=1, dp=1, tp=1, gpus_per_node=8).span("ep")
