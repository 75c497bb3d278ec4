"""What the emulator samples while traffic runs (emulator.sampling), without a fabric: the tc queue
counters' parser and the sampler against a fabric stand-in."""

from __future__ import annotations

import time

from emulator.sampling import Sampler, parse_qdisc_drops


def test_parse_qdisc_drops():
    text = (
        "qdisc htb 5: dev leaf1-eth3 root refcnt 2 r2q 10 default 0x1 direct_packets_stat 0 direct_qlen 1000\n"
        " Sent 12345 bytes 67 pkt (dropped 3, overlimits 10 requeues 0)\n"
        " backlog 0b 0p requeues 0\n"
        "qdisc pfifo 10: dev leaf1-eth3 parent 5:1 limit 100p\n"
        " Sent 12345 bytes 67 pkt (dropped 3, overlimits 0 requeues 0)\n"
    )
    assert parse_qdisc_drops(text) == {"leaf1-eth3": {"sent_packets": 67, "dropped": 3}}


class _Api:
    def __init__(self) -> None:
        self.calls = 0

    def links(self) -> dict:
        self.calls += 1
        if self.calls == 2:
            raise ConnectionError("controller restarting")
        return {"links": [{"name": "h1-leaf1", "tx_bytes": 100 * self.calls}]}


class _Fabric:
    def __init__(self) -> None:
        self.api = _Api()


def test_sampler_records_links_and_cpu_and_survives_a_failed_poll():
    sampler = Sampler(_Fabric(), interval=0.02)
    sampler.sample_once()
    sampler.start()
    deadline = time.monotonic() + 5
    while (len(sampler.samples) < 3 or not sampler.cpu) and time.monotonic() < deadline:
        time.sleep(0.01)
    sampler.stop()
    assert not sampler.is_alive()
    assert sampler.errors == 1 and len(sampler.samples) >= 3
    assert sampler.samples[0]["links"] == [{"name": "h1-leaf1", "tx_bytes": 100}]
    times = [s["t"] for s in sampler.samples]
    assert times == sorted(times)
    assert all(0.0 <= c["idle"] <= 1.0 and 0.0 <= c["steal"] <= 1.0 and c["dt"] > 0 for c in sampler.cpu)
