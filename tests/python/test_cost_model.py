"""The cost model's arithmetic (bluefog.common.cost_model): pure Python, no MPI."""

import json

import pytest

from bluefog.common import cost_model as cm

MIB16 = 16 << 20
# A slow link between hosts (1 Gbit/s) and no latency, so times are bytes over bandwidths.
SLOW = cm.Costs(cm.Link(0.0, 1e9), cm.Link(0.0, 125e6), 0.0, 1e15, 1e12)


def test_cross_bytes_of_each_method_at_two_hosts_of_four():
    t = cm.predict(SLOW, 8, 4, MIB16)
    link = MIB16 / 125e6  # one 16 MiB tensor over the link
    # ExponentialGraph(8): 7 tensors leave each host; the machine-aware default: 1.
    assert t["neighbor, ExponentialGraph"] == pytest.approx(7 * link, rel=0.01)
    assert t["neighbor, HierarchicalExponentialGraph"] == pytest.approx(link, rel=0.1)
    # One machine mean per direction, split over the 4 local ranks, after a reduce-scatter and
    # before an allgather within the host (3/4 of the tensor each, per rank).
    local = 2 * 0.75 * MIB16 / 1e9
    assert t["hierarchical, ExponentialGraph of machines"] == pytest.approx(link + local, rel=0.01)
    # Hierarchical allreduce over 2 hosts: 2 (n-1) / n = 1 mean per direction.
    assert t["hierarchical, one-peer machines every 2nd step"] == pytest.approx(link / 2 + local,
                                                                               rel=0.01)
    assert t["allreduce (hierarchical)"] == pytest.approx(link + local, rel=0.01)
    assert t["allreduce (flat ring)"] > t["allreduce (hierarchical)"]


def test_recommendation():
    method, how, _ = cm.recommend(SLOW, 8, 4, MIB16)
    assert method == "hierarchical, one-peer machines every 2nd step"
    assert "GetInnerOuterExp2DynamicSendRecvMachineRanks" in how
    # With a link as fast as memory nothing is 1.2x faster than exact averaging at 2 ranks.
    fast = cm.Costs(cm.Link(1e-4, 1e9), cm.Link(1e-4, 1e9), 1e-3, 1e9, 1e12)
    assert cm.recommend(fast, 2, 1, MIB16)[0].startswith("allreduce")


def test_one_peer_schedule_cost_is_one_tensor_per_rank():
    t = cm.predict(SLOW, 64, 1, MIB16)
    assert t["neighbor, one-peer exponential"] == pytest.approx(MIB16 / 125e6, rel=0.01)


def test_costs_round_trip_and_errors():
    assert cm.Costs.from_dict(json.loads(json.dumps(SLOW.as_dict()))) == SLOW
    with pytest.raises(ValueError, match="local_size 3 must divide size 8"):
        cm.predict(SLOW, 8, 3, MIB16)
    assert "| allreduce (hierarchical) |" in cm.format_table(SLOW, [64, 128], 8, MIB16)
