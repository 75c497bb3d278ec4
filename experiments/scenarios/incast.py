"""Incast: many senders to one receiver, the pattern collectives, parameter fetches and storage reads
all make. Per arm the incast's completion (its last byte) against its ideal, how evenly the flows
shared, the receiver's downlink queue over time, drops and retransmissions."""

from __future__ import annotations

from typing import Any

from experiments.model import Arm, Experiment, SenderSettings, Workload
from experiments.scenarios.common import ok_arms, secs
from experiments.schema import ResultsDocument, arm_label
from topologies import Topology

NAME = "incast"
SUMMARY = "N senders to one receiver: completion of the last byte against its ideal, fairness, the receiver's queue"
RECEIVER = "h1"
# 8:1 on a 3-leaf fabric of 9 hosts: two senders share the receiver's leaf, six come over the spines.
# 2 MB per flow as htsim's incast matrices, in jumbo frames as AI fabrics run: the headers cost under
# 1 % of a frame (6 % at 1500 bytes), so the payload ideal is one a transport can nearly reach. 32 Mb/s
# per host: ~440 frames per second converge on the receiver, well inside what two cores emulate at
# fidelity. The receiver's downlink is the bottleneck; its queue holds 1000 frames.
TOPOLOGY = "leaf-spine:spines=2,leaves=3,hosts=3,host_rate=32,fabric_rate=64,mtu=9000"
FLOW_BYTES = 2 * 1024 * 1024
# The controllers compared, each over ECMP (one EV per flow) and spraying.
CONTROLLERS = ("credit", "nscc", "delay")


def _arms() -> list[Arm]:
    arms = []
    for cc in CONTROLLERS:
        arms.append(Arm(f"{cc}-ecmp", mode="ecmp", policy="single", sender=SenderSettings(cc=cc), labels={"cc": cc}))
        arms.append(Arm(f"{cc}-spray", mode="spray", policy="spray", sender=SenderSettings(cc=cc),
                        labels={"cc": cc}))
    arms.append(Arm("tcp-ecmp", kind="tcp", mode="ecmp", labels={"cc": "tcp"}))
    return arms


def build() -> Experiment:
    from topologies import parse_spec

    topo = parse_spec(TOPOLOGY)
    leaf, _ = topo.host_switch(RECEIVER)
    return Experiment(
        name=NAME,
        title="Incast: many senders, one receiver",
        description=f"Every other host sends {FLOW_BYTES // 1024} KiB to {RECEIVER} at once. The receiver's "
        "downlink is the bottleneck: the incast ideally ends when all bytes have crossed it at its rate, "
        "with every flow finishing together. Senders that do not hold back overflow its queue, lose "
        "packets and finish unevenly.",
        topology=TOPOLOGY,
        arms=_arms(),
        # Every other host of the fabric run on (`--topo` with 16 hosts makes it 15:1).
        workload=Workload(pattern="incast", receiver=RECEIVER, bytes_per_flow=FLOW_BYTES, message_size=65536),
        duration_s=6.0,
        seed=1,
        extra={"watch_queue": [leaf, RECEIVER], "receiver": RECEIVER},
    )


def _receiver_rate_bps(topo: Topology, receiver: str) -> float:
    return min(lk.rate_mbps for lk in topo.links_of(receiver)) * 1e6


def analyse(doc: ResultsDocument, topo: Topology) -> dict[str, Any]:
    receiver = doc.get("extra", {}).get("receiver", RECEIVER)
    rate = _receiver_rate_bps(topo, receiver)
    out: dict[str, Any] = {"receiver": receiver, "receiver_rate_bps": rate, "fan_in": 0, "arms": {}}
    for a in ok_arms(doc["arms"]):
        flows = [f for f in a["flows"] if f.get("dst") == receiver]
        if not flows:
            continue
        total = sum(f.get("bytes") or 0 for f in flows)
        # Bytes of payload over the receiver's link: the ideal ignores headers, as htsim's does.
        ideal = 8 * total / rate if rate > 0 else None
        done = [f.get("duration_s") for f in flows if f.get("completed") and f.get("duration_s") is not None]
        last = max(done) if len(done) == len(flows) else None
        ratio = last / ideal if last is not None and ideal else None
        # The same with the bytes the frames put on the wire (headers, ACK-free direction): what a
        # transport can reach at best on this link; the payload ideal is htsim's and the figure.
        wire = sum(f.get("wire_bytes") or 0 for f in flows)
        wire_ideal = 8 * wire / rate if wire and rate > 0 else None
        spread = (max(done) - min(done)) / max(done) if done and max(done) > 0 else None
        sent = sum(f.get("data_packets") or 0 for f in flows)
        retx = sum(f.get("retransmissions") or 0 for f in flows)
        drops = (a.get("queue_drops") or {}).get(_downlink(topo, receiver), 0)  # only queues that dropped are listed
        a["incast_completion_s"] = last
        a["incast_ideal_s"] = ideal
        a["incast_completion_ratio"] = ratio
        a["incast_wire_ratio"] = last / wire_ideal if last is not None and wire_ideal else None
        a["completion_spread"] = spread
        a["retransmit_share"] = retx / sent if sent else None
        a["receiver_queue_drops"] = drops
        out["fan_in"] = len(flows)
        out["arms"][a["name"]] = {"incast_completion_ratio": ratio, "incast_wire_ratio": a["incast_wire_ratio"],
                                  "completion_spread": spread,
                                  "queue_max_packets": a.get("queue_max_packets"), "drops": drops,
                                  "retransmit_share": a["retransmit_share"]}
    return out


def _downlink(topo: Topology, receiver: str) -> str:
    leaf, _ = topo.host_switch(receiver)
    link = next(lk for lk in topo.links if {lk.a, lk.b} == {leaf, receiver})
    return link.intf(leaf)


def sentences(doc: ResultsDocument) -> list[str]:
    an = doc["analysis"]
    out = []
    if an.get("fan_in"):
        out.append(f"{an['fan_in']}:1 incast into {an['receiver']} "
                   f"({an['receiver_rate_bps'] / 1e6:g} Mb/s link): the ideal is every byte over that link, "
                   "all flows finishing together.")
    for a in ok_arms(doc["arms"]):
        ratio, spread = a.get("incast_completion_ratio"), a.get("completion_spread")
        if a.get("incast_ideal_s") is None:
            continue
        wr = a.get("incast_wire_ratio")
        what = (f"last byte after {secs(a.get('incast_completion_s'))}, {ratio:.2f}x the ideal "
                f"{secs(a['incast_ideal_s'])}" + (f" ({wr:.2f}x counting the frames' headers)" if wr else "")
                if ratio is not None else "did not finish every flow")
        fair = f"; flows finished within {spread:.0%} of each other" if spread is not None else ""
        q = a.get("queue_max_packets")
        queue = f"; receiver queue peaked at {q} packets" if q is not None else ""
        drops = a.get("receiver_queue_drops")
        lost = f", {drops} dropped there" if drops is not None else ""
        retx = a.get("retransmit_share")
        rt = f"; {retx:.1%} of packets retransmitted" if retx is not None else ""
        out.append(f"{arm_label(a)}: {what}{fair}{queue}{lost}{rt}.")
    return out
