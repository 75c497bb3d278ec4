"""Path policies: single, spray and adaptive, alone and over the simulated network."""

from __future__ import annotations

import random

import pytest

from transport.core.config import TransportConfig
from transport.core.paths import Adaptive, SinglePath, Spray
from transport.core.policy_plugin import make_policy
from transport.sim.simnet import PathSpec, run_transfer


def test_single_uses_one_ev_and_another_only_to_avoid_it() -> None:
    p = make_policy("single", 8, random.Random(1))
    assert isinstance(p, SinglePath)
    evs = {p.next_ev(0.0) for _ in range(50)}
    assert len(evs) == 1
    (ev,) = evs
    assert p.next_ev(0.0, avoid=ev) != ev
    assert make_policy("single", 1, random.Random(1)).next_ev(0.0, avoid=0) == 0


def test_single_ev_depends_on_the_seed() -> None:
    assert len({make_policy("single", 16, random.Random(s)).next_ev(0.0) for s in range(40)}) > 4


def test_spray_rotates_over_all_evs() -> None:
    p = make_policy("spray", 5, random.Random(2))
    assert isinstance(p, Spray)
    seq = [p.next_ev(0.0) for _ in range(10)]
    assert sorted(seq[:5]) == [0, 1, 2, 3, 4]
    assert seq[:5] == seq[5:]
    ev = p.next_ev(0.0)
    assert p.next_ev(0.0, avoid=(ev + 1) % 5) == (ev + 2) % 5


def test_adaptive_benches_a_lossy_ev_then_probes_it_again() -> None:
    p = Adaptive(4, random.Random(0), min_cooldown=0.01)
    for ev in range(4):
        p.on_ack(ev, 0.001, 0.0)
    p.on_loss(2, 0.0)
    assert 2 not in {p.next_ev(0.001) for _ in range(20)}
    # The cool-down is 16 best RTTs (0.016 s) here; after it the EV is probed again.
    assert 2 in {p.next_ev(0.02) for _ in range(20)}
    # Offending again right after coming back doubles the cool-down.
    p.on_loss(2, 0.02)
    assert p.backoff[2] == 2
    assert 2 not in {p.next_ev(0.02 + 0.03) for _ in range(20)}
    assert 2 in {p.next_ev(0.02 + 0.033) for _ in range(20)}


def test_adaptive_benches_an_ev_with_inflated_rtt() -> None:
    p = Adaptive(3, random.Random(0))
    p.on_ack(0, 0.001, 0.0)
    p.on_ack(1, 0.001, 0.0)
    p.on_ack(2, 0.010, 0.0)
    assert 2 not in {p.next_ev(0.0001) for _ in range(12)}


def test_adaptive_never_returns_the_avoided_ev_when_another_exists() -> None:
    p = Adaptive(2, random.Random(0))
    p.on_timeout(0, 0.0)
    p.on_timeout(1, 0.0)
    assert all(p.next_ev(0.0, avoid=1) == 0 for _ in range(5))


def test_unknown_policy() -> None:
    with pytest.raises(ValueError, match="unknown path policy"):
        make_policy("ecmp", 4, random.Random(0))


def _lossy_share(policy: str, loss: float, n: int = 4) -> tuple[float, bool]:
    paths = [PathSpec() for _ in range(n - 1)] + [PathSpec(loss=loss)]
    cfg = TransportConfig(path_policy=policy, num_evs=n)
    r = run_transfer(cfg, cfg, paths, total_bytes=3 * 2**20, seed=3)
    # Data packets sent on each path in the second half of the transfer (after convergence) are
    # approximated by the per-EV counters, since EV i maps to path i here.
    per_ev = r.sender_metrics["sender"]["per_ev"]
    sent = [per_ev.get(str(i), {}).get("packets_sent", 0) for i in range(n)]
    return sent[n - 1] / sum(sent), r.completed


@pytest.mark.parametrize("loss", [0.02, 0.1])
def test_adaptive_moves_traffic_off_a_lossy_path(loss: float) -> None:
    n = 4
    share, completed = _lossy_share("adaptive", loss, n)
    assert completed
    assert share < 0.5 / n
    spray_share, _ = _lossy_share("spray", loss, n)
    assert spray_share == pytest.approx(1 / n, abs=0.02)
