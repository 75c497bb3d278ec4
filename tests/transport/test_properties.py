"""Property tests over the simulated network: whatever the impairments, every message arrives
exactly once and byte-identical (in order when ordered), memory caps hold, and a timer is armed
whenever data is outstanding."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transport.core.config import TransportConfig
from transport.core.congestion import CONTROLLERS
from transport.sim.simnet import PathSpec, run_transfer

prob = st.floats(0.0, 0.3)


@st.composite
def path_specs(draw) -> PathSpec:
    down = []
    if draw(st.booleans()):
        start = draw(st.floats(0.0, 0.05))
        down.append((start, start + draw(st.floats(0.001, 0.05))))
    return PathSpec(
        rate_bps=draw(st.sampled_from([20e6, 100e6])),
        delay=draw(st.floats(0.0001, 0.002)),
        queue_packets=draw(st.integers(8, 64)),
        loss=draw(prob),
        duplicate=draw(st.floats(0.0, 0.1)),
        corrupt=draw(st.floats(0.0, 0.1)),
        reorder=draw(prob),
        reorder_delay=draw(st.floats(0.0, 0.003)),
        down=down,
    )


@st.composite
def configs(draw) -> TransportConfig:
    return TransportConfig(
        mtu=draw(st.sampled_from([200, 600, 1400])),
        delivery=draw(st.sampled_from(["unordered", "ordered"])),
        recovery=draw(st.sampled_from(["selective", "gobackn"])),
        path_policy=draw(st.sampled_from(["single", "spray", "adaptive"])),
        num_evs=draw(st.integers(1, 8)),
        cc=draw(st.sampled_from(CONTROLLERS.names())),
        window=draw(st.integers(1, 64)),
        ack_delay=draw(st.sampled_from([0.0, 0.0005])),
        max_reassembly_bytes=draw(st.sampled_from([8_000, 30_000, 8 * 2**20])),
        max_reassembly_messages=draw(st.sampled_from([2, 16, 1024])),
        pacing=draw(st.booleans()),
        # Known or unknown link rate and base RTT: BDP-sized windows, and credit paced or only windowed.
        link_rate_bps=draw(st.sampled_from([0.0, 20e6, 100e6])),
        base_rtt=draw(st.sampled_from([0.0, 0.002])),
    )


# Raise FABRICLAB_EXAMPLES for a longer soak than the suite's default.
EXAMPLES = int(os.environ.get("FABRICLAB_EXAMPLES", "40"))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cfg=configs(),
    paths=st.lists(path_specs(), min_size=1, max_size=4),
    sizes=st.lists(st.integers(0, 8000), min_size=1, max_size=12),
    seed=st.integers(0, 2**16),
    wrap=st.booleans(),
)
def test_exactly_once_byte_identical_delivery(cfg, paths, sizes, seed, wrap) -> None:
    cfg.validate()
    limit = TransportConfig(mtu=cfg.mtu, max_reassembly_bytes=cfg.max_reassembly_bytes)
    sizes = [min(s, limit.max_payload * (cfg.max_reassembly_bytes // limit.max_payload)) for s in sizes]
    msgs = [bytes((i * 7 + j) & 0xFF for j in range(n)) for i, n in enumerate(sizes)]
    r = run_transfer(cfg, cfg, paths, messages=msgs, seed=seed, time_limit=120.0,
                     initial_psn=2**32 - 5 if wrap else 0)
    assert r.completed, r.sender_metrics["state"]
    ids = [i for i, _ in r.delivered]
    assert sorted(ids) == list(range(len(msgs)))  # exactly once
    for i, data in r.delivered:
        assert data == msgs[i]
    if cfg.delivery == "ordered":
        assert ids == list(range(len(msgs)))
    assert sorted(r.acked) == list(range(len(msgs)))
    rm = r.receiver_metrics["receiver"]
    assert rm["peak_reassembly_bytes"] <= cfg.max_reassembly_bytes
    assert rm["peak_reassembly_messages"] <= cfg.max_reassembly_messages
    assert rm["reassembly_bytes"] == 0
    assert r.timer_always_armed
