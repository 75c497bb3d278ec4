"""The checks `make vm-test` runs inside the fabriclab VM, on the code paths only such a kernel enables.

One line per check (PASS/FAIL, name, the measured figure against what was configured) on stdout, the
same as JSON in OUT/results.json; exit status 1 when any check failed. Everything goes through
fabriclab's own doctor, Fabric and probe, on the OVS kernel datapath with netem:

- doctor reports the kernel datapath and netem (and whether RED can mark ECN);
- a leaf-spine with a delay on every link comes up on the kernel datapath (its bridges are in the
  kernel's ovs-system datapath);
- the probe splits evenly over the spines under spray and pins one spine under ECMP with a fixed port;
- ping's RTT shows the configured delay of every link on the path, both ways;
- RED with ECN on a congested link marks ECN-capable packets instead of dropping them (and drops
  early what is not ECN-capable);
- loss set on a link goes through netem, and the loss the probe measures matches it;
- teardown leaves nothing behind.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from emulator.network import Fabric  # noqa: E402
from emulator.probe import run_probe  # noqa: E402
from tests.emulator_helpers import leftovers  # noqa: E402
from topologies import parse_spec  # noqa: E402
from topologies.paths import equal_cost_paths  # noqa: E402

log = logging.getLogger("vm-checks")

DELAY_MS = 2.0
LOSS_PCT = 10.0
SPEC = f"leaf-spine:spines=2,leaves=2,hosts=1,rate=20,delay={DELAY_MS}"
PROBE_PPS = 400.0
LOSS_PACKETS = 2000
PING_COUNT = 30
ECN_PACKETS = 3000


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    figures: dict = field(default_factory=dict)

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'} {self.name}: {self.detail}"


class Checks:
    def __init__(self) -> None:
        self.done: list[Check] = []

    def add(self, name: str, ok: bool, detail: str, **figures: object) -> bool:
        check = Check(name, bool(ok), detail, dict(figures))
        self.done.append(check)
        print(check.line(), flush=True)
        return check.ok


def sh(cmd: list[str], timeout: float = 60.0) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return out.stdout + out.stderr


def check_doctor(checks: Checks) -> dict:
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "cli", "doctor", "--json"], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    try:
        caps = json.loads(out.stdout)["capabilities"]
    except (json.JSONDecodeError, KeyError):
        checks.add("doctor", False, f"fabriclab doctor printed no JSON: {(out.stdout + out.stderr)[-300:]}")
        return {}
    took = time.monotonic() - t0
    checks.add("doctor kernel datapath", caps["datapath"] == "kernel",
               f"datapath {caps['datapath']}, OVS {caps['ovs_version']} (doctor took {took:.1f} s)",
               datapath=caps["datapath"], doctor_s=round(took, 1))
    checks.add("doctor netem", caps["netem"] and caps["loss_method"] == "netem",
               f"netem {'yes' if caps['netem'] else 'no'}, loss method {caps['loss_method']}",
               netem=caps["netem"], loss_method=caps["loss_method"])
    if "red_ecn" in caps:
        checks.add("doctor red/ecn", caps["red_ecn"], f"RED with ECN marking {'yes' if caps['red_ecn'] else 'no'}",
                   red_ecn=caps["red_ecn"])
    return caps


def kernel_datapath_ports() -> list[str]:
    """Ports the kernel's ovs-system datapath holds (the kernel datapath's own view, not OVSDB's)."""
    out = sh(["ovs-dpctl", "show"])
    return re.findall(r"port \d+: (\S+)", out)


def path_delay_ms(topo, src: str, dst: str) -> float:
    """The configured round trip: every link's delay on one equal-cost path, both ways."""
    path = equal_cost_paths(topo, src, dst)[0]
    one_way = sum(topo.links_between(a, b)[0].delay_ms for a, b in itertools.pairwise(path))
    return 2 * one_way


def parse_ping(text: str) -> dict:
    m = re.search(r"(\d+) packets transmitted, (\d+) received", text)
    r = re.search(r"= ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+) ms", text)
    if not (m and r):
        return {}
    return {"sent": int(m[1]), "received": int(m[2]), "min_ms": float(r[1]), "avg_ms": float(r[2]),
            "max_ms": float(r[3])}


def red_counters(fab: Fabric, host: str, intf: str) -> dict[str, int]:
    out = fab.host(host).cmd(f"tc -s qdisc show dev {intf}")
    m = re.search(r"marked (\d+) early (\d+) pdrop (\d+)", out)
    return {"marked": int(m[1]), "early": int(m[2]), "pdrop": int(m[3])} if m else {}


# A burst of UDP datagrams with a given TOS byte (its low two bits are the ECN field), at most 30 per
# 4 ms (7,500/s). Unpaced, as fast as Python goes, it once kept the emulated guest's CPU in softirq for
# the whole run (a soft lockup under TCG). It prints the rate it reached.
BURST = ("import socket, sys, time; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
         "s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, int(sys.argv[2])); p = bytes(1000); "
         "n = int(sys.argv[3]); t0 = time.monotonic(); "
         "[(s.sendto(p, (sys.argv[1], 9)), i % 30 == 29 and time.sleep(0.004)) for i in range(n)]; "
         "print(round(n / (time.monotonic() - t0)))")
# The check slows the sender's link to this rate (250 datagrams/s of 1000 bytes) while it runs. How fast
# the guest's Python sends depends on the host: under TCG on a slow host it reached less than the
# fabric's 20 Mb/s, no queue built and RED had nothing to mark. At 2 Mb/s a guest that sends a tenth
# of the pace still queues three times faster than the link drains.
ECN_RATE_MBPS = 2.0


def congest(fab: Fabric, src: str, dst: str, tos: int, packets: int = ECN_PACKETS) -> int | None:
    """Send the burst; returns the datagrams per second it reached (None when it printed no rate)."""
    out = fab.host(src).cmd(f"timeout 120 python3 -c '{BURST}' {fab.ip(dst)} {tos} {packets}")
    m = re.search(r"^(\d+)\s*$", out, re.M)
    return int(m[1]) if m else None


def check_ecn(checks: Checks, fab: Fabric, src: str, dst: str) -> None:
    # The first queue the traffic meets is the sender's own egress.
    sw, _ = fab.topology.host_switch(src)
    link = fab.topology.links_between(src, sw)[0]
    intf = link.intf(src)
    fab.set_rate(src, sw, ECN_RATE_MBPS)
    fab.set_ecn(src, sw)
    try:
        ect_pps = congest(fab, src, dst, tos=0x02)  # ECT(0)
        ect = red_counters(fab, src, intf)
        plain_pps = congest(fab, src, dst, tos=0x00)  # not ECN-capable
        after = red_counters(fab, src, intf)
    finally:
        fab.set_ecn(src, sw, on=False)
        fab.set_rate(src, sw, link.rate_mbps)
    plain = {k: after[k] - ect[k] for k in after} if ect and after else {}
    ok = bool(ect) and ect["marked"] > 0 and ect["early"] == 0 and plain.get("marked", 1) == 0 \
        and plain.get("early", 0) > 0
    drain_pps = ECN_RATE_MBPS * 1e6 / 8 / 1000
    checks.add("red marks ecn", ok,
               f"bursts of {ECN_PACKETS} UDP datagrams at {ect_pps} and {plain_pps} /s into a {ECN_RATE_MBPS} "
               f"Mb/s link (drains {drain_pps:.0f} /s): "
               f"ECT(0) packets marked {ect.get('marked')}, dropped early {ect.get('early')}; "
               f"not-ECT packets marked {plain.get('marked')}, dropped early {plain.get('early')}",
               ect=ect, not_ect=plain, ect_pps=ect_pps, not_ect_pps=plain_pps, link_mbps=ECN_RATE_MBPS)


def check_fabric(checks: Checks) -> None:
    topo = parse_spec(SPEC)
    src, dst = topo.hosts[0].name, topo.hosts[-1].name
    t0 = time.monotonic()
    with Fabric(topo, mode="spray", ready_timeout=300.0) as fab:
        up_s = time.monotonic() - t0
        ports = kernel_datapath_ports()
        switch_ports = [p for p in ports if "-eth" in p]
        dp_type = sh(["ovs-vsctl", "get", "Bridge", topo.switches[0].name, "datapath_type"]).strip()
        want_ports = 2 * len(topo.links) - len(topo.hosts)  # switch ends of every link
        checks.add("fabric up on the kernel datapath",
                   fab.datapath == "kernel" and len(switch_ports) == want_ports and dp_type in ('""', "system"),
                   f"{SPEC} up in {up_s:.1f} s; datapath {fab.datapath} (OVSDB datapath_type {dp_type}), "
                   f"{len(switch_ports)} of {want_ports} switch ports in the kernel's ovs-system datapath",
                   bring_up_s=round(up_s, 1), kernel_ports=len(switch_ports), want_ports=want_ports)

        r = run_probe(fab, src, dst, packets=1600, entropy="rotate", rate_pps=PROBE_PPS)
        counts = list(r.per_spine.values())
        bal = max(counts) / min(counts) if min(counts) > 0 else math.inf
        checks.add("spray splits evenly", bal <= 1.05 and r.packets_received == r.packets_sent,
                   f"rotating source ports: per spine {r.per_spine}, max/min {bal:.3f}, "
                   f"{r.packets_received}/{r.packets_sent} delivered",
                   per_spine=r.per_spine, balance=bal)

        fab.set_mode("ecmp")
        r = run_probe(fab, src, dst, packets=800, entropy="fixed", rate_pps=PROBE_PPS)
        total = sum(r.per_spine.values())
        share = max(r.per_spine.values()) / total if total else 0.0
        checks.add("ecmp pins one spine", share >= 0.99 and r.packets_received == r.packets_sent,
                   f"one source port: per spine {r.per_spine}, largest share {share:.3f}",
                   per_spine=r.per_spine, share=share)

        want_rtt = path_delay_ms(topo, src, dst)
        out = fab.host(src).cmd(f"ping -c {PING_COUNT} -i 0.2 -q {fab.ip(dst)}")
        p = parse_ping(out)
        ok = bool(p) and p["received"] == p["sent"] and want_rtt <= p["min_ms"] <= want_rtt * 1.25 + 2.0
        checks.add("delay shows in ping's RTT", ok,
                   f"configured {want_rtt:.1f} ms ({DELAY_MS} ms on each of the path's links, both ways); "
                   + (f"measured min {p['min_ms']:.2f} / avg {p['avg_ms']:.2f} / max {p['max_ms']:.2f} ms"
                      if p else f"ping failed: {out.strip()[-200:]}"),
                   configured_rtt_ms=want_rtt, **p)

        check_ecn(checks, fab, src, dst)

        # On the last hop, the switch's egress toward the receiver: every probe packet crosses it once.
        switch_end, _ = topo.host_switch(dst)
        method = fab.set_loss(switch_end, dst, LOSS_PCT)
        qdisc = sh(["tc", "qdisc", "show", "dev", topo.links_between(switch_end, dst)[0].intf(switch_end)])
        fab.set_mode("spray")
        r = run_probe(fab, src, dst, packets=LOSS_PACKETS, entropy="rotate", rate_pps=PROBE_PPS)
        measured = 100.0 * (1 - r.packets_received / r.packets_sent)
        p_ = LOSS_PCT / 100
        tolerance = 100 * 4 * math.sqrt(p_ * (1 - p_) / r.packets_sent)  # four standard deviations
        ok = method == "netem" and "netem" in qdisc and abs(measured - LOSS_PCT) <= tolerance
        checks.add("loss goes through netem", ok,
                   f"configured {LOSS_PCT:.1f} % on {switch_end}->{dst} via {method}; measured "
                   f"{measured:.2f} % of {r.packets_sent} (tolerance +-{tolerance:.2f})",
                   configured_pct=LOSS_PCT, measured_pct=round(measured, 2), packets=r.packets_sent,
                   method=method)
        t_down = time.monotonic()
    down_s = time.monotonic() - t_down
    left = {k: v for k, v in leftovers().items() if v}
    ports = [p for p in kernel_datapath_ports() if "-eth" in p]
    checks.add("teardown leaves nothing", not left and not ports,
               f"torn down in {down_s:.1f} s; leftovers {left or 'none'}; kernel datapath ports left {len(ports)}",
               teardown_s=round(down_s, 1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="write results.json here")
    ap.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    checks = Checks()
    t0 = time.monotonic()

    def too_slow(signum: int, frame: object) -> None:
        raise TimeoutError(f"the checks did not finish within {args.timeout:.0f} s")

    # A hung step must still leave results behind (teardown runs as the exception unwinds).
    signal.signal(signal.SIGALRM, too_slow)
    signal.alarm(int(args.timeout))
    check_doctor(checks)
    try:
        check_fabric(checks)
    except Exception as exc:  # a check that cannot finish is a failed check, said in one line
        checks.add("fabric checks", False, f"{type(exc).__name__}: {exc}")
    signal.alarm(0)
    took = time.monotonic() - t0
    failed = [c.name for c in checks.done if not c.ok]
    print(f"{len(checks.done) - len(failed)} passed, {len(failed)} failed in {took:.0f} s inside the VM", flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(
            {"checks": [asdict(c) for c in checks.done], "failed": failed, "checks_s": round(took, 1),
             "uname": sh(["uname", "-r"]).strip()}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
