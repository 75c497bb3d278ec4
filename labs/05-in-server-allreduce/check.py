"""Lab 5 checker: in-server locality and ring all-reduce.

On a folder of code (your copy of starter/, holding collective.py):
- `send_chunk` drives a ring over real float32 arrays for 2 to 8 ranks: every rank must end with
  the sum, bit for bit what transport.collective.ring.ring_reference adds up (the order of float additions
  matters), and the schedule must be transport.collective.ring.RingWorker's, which the wire protocol checks;
- `bus_bandwidth` and `ring_time_bound` must agree with transport.io.allreduce.bandwidth_bound, and the
  bound must hold for a ring with one slow edge run in the simulated network (transport.sim.simnet);
- `ring_order` must cross servers as few times as a ring can, and in the simulated network (each
  ring edge at its max-min fair share of the links it crosses, from experiments.analysis) be at
  least 1.6x faster than the live view's order, which alternates servers.

On a results directory: `fabriclab run in-server` (ping and all-reduce through the local switch
faster than via the ToR, the via-ToR ring no faster than its share of the NIC allows, results equal
to numpy's) and/or `fabriclab run allreduce` (results equal to numpy's, no faster than the link,
lossless arms within 2.5x of the bound, every rank as slow as the slowest).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from experiments.analysis.placement import capacities, max_min_rates, path_weights
from experiments.scenarios import allreduce, in_server
from labs import grading
from labs.catalogue import LabError
from labs.grading import Check
from live.workload import ring_order as alternating_order
from topologies import Topology, parse_spec
from transport.collective.ring import RingWorker, chunk_bounds, make_input, ring_reference
from transport.core.config import TransportConfig
from transport.io.allreduce import bandwidth_bound
from transport.sim.ringsim import ring_allreduce_simulated
from transport.sim.simnet import PathSpec

CODE = "collective.py"
RANKS = range(2, 9)
SIM_DELAY = 0.0002


def _phase(step: int, n: int) -> str:
    return "reduce-scatter" if step < n - 1 else "all-gather"


def _student_chunk(mod: ModuleType, rank: int, step: int, n: int) -> tuple[int | None, Check | None]:
    c, err = grading.call(mod, "send_chunk", rank, step, n)
    if err:
        return None, err
    if not isinstance(c, (int, np.integer)) or isinstance(c, bool) or not 0 <= c < n:
        return None, grading.failed("send_chunk", f"send_chunk({rank}, {step}, {n}) returned {c!r:.40}, "
                                    f"expected a chunk number in 0..{n - 1}")
    return int(c), None


def run_schedule(send: Callable[[int, int, int], int], inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Every rank's array after 2(n-1) steps in which rank r sends chunk send(r, g, n) to rank r+1,
    which adds it (reduce-scatter) or stores it (all-gather)."""
    n = len(inputs)
    bounds = chunk_bounds(len(inputs[0]), n)
    bufs = [x.copy() for x in inputs]
    for g in range(2 * (n - 1)):
        sent = [(r, send(r, g, n)) for r in range(n)]
        payloads = [bufs[r][slice(*bounds[c])].copy() for r, c in sent]  # every rank sends at once
        for (r, c), data in zip(sent, payloads, strict=True):
            view = bufs[(r + 1) % n][slice(*bounds[c])]
            if g < n - 1:
                np.add(view, data, out=view)
            else:
                view[:] = data
    return bufs


def check_schedule(mod: ModuleType) -> list[Check]:
    table: dict[tuple[int, int, int], int] = {}
    for n in RANKS:
        for r in range(n):
            for g in range(2 * (n - 1)):
                c, err = _student_chunk(mod, r, g, n)
                if err:
                    return [err]
                table[(r, g, n)] = c  # type: ignore[assignment]
    size = 997  # chunks of unequal length, as np.array_split cuts them
    not_summed: list[str] = []  # where a rank does not end with the sum
    reordered: list[str] = []  # where it does, but not bit for bit as fabriclab's ring adds
    for n in RANKS:
        inputs = [make_input(7, r, size) for r in range(n)]
        out = run_schedule(lambda r, g, n: table[(r, g, n)], inputs)
        total = np.sum(np.asarray(inputs, dtype=np.float64), axis=0)
        ref = ring_reference(inputs)
        for r, buf in enumerate(out):
            if not np.allclose(buf, total, rtol=1e-4, atol=1e-3):
                not_summed.append(f"with {n} ranks, rank {r} does not end with the sum of all ranks' arrays")
            elif not np.array_equal(buf, ref):
                reordered.append(f"with {n} ranks, rank {r}")
    checks = [grading.holds("send_chunk: the ring all-reduces", not not_summed,
                            f"every rank of rings of {RANKS.start}-{RANKS.stop - 1} ranks ends with the sum of all "
                            "arrays", not_summed[0] if not_summed else "")]
    wrong = next(((r, g, n) for (r, g, n), c in table.items() if c != RingWorker(r, n, np.zeros(n)).send_chunk(g)),
                 None)
    if wrong is None:
        checks.append(grading.holds("send_chunk: fabriclab's schedule", not reordered,
                                    "the same chunk at every step as transport.collective.ring, so the same "
                                    "float32 sum, bit for bit",
                                    f"{reordered[0] if reordered else ''}: not bit for bit the sum "
                                    "fabriclab's ring computes"))
    else:
        r, g, n = wrong
        also = ("; your ring still all-reduces, but adds in another order, so its float32 sums differ from "
                "ring_reference in the last bits" if reordered and not not_summed else "")
        checks.append(grading.failed("send_chunk: fabriclab's schedule",
                                     f"with {n} ranks, rank {r} at step {g} ({_phase(g, n)}) sends chunk "
                                     f"{table[wrong]}; transport.collective.ring's rank sends chunk "
                                     f"{RingWorker(r, n, np.zeros(n)).send_chunk(g)}{also}"))
    return checks


def _sim_ring(n: int, size: int, edge_rates: list[float]) -> float:
    """Seconds per iteration of the slowest rank of a simulated ring whose edge r runs at edge_rates[r]."""
    paths = [[PathSpec(rate_bps=rate, delay=SIM_DELAY)] for rate in edge_rates]
    res = ring_allreduce_simulated(n, size, seed=1, config=TransportConfig(path_policy="spray"), paths=paths,
                                   iterations=2, time_limit=30.0)
    if not res.completed:
        raise LabError(f"the simulated ring did not finish: {res.mismatch}")
    return max(float(np.mean(t)) for t in res.iteration_times)


def _agrees(name: str, got: Any, want: float, call: str, unit: str) -> Check:
    if not isinstance(got, (int, float)) or isinstance(got, bool):
        return grading.failed(name, f"{call} returned {got!r:.60}, expected a number of {unit}")
    return grading.holds(name, abs(got - want) <= 1e-6 * abs(want), f"{call} = {got:.4g} {unit}",
                         f"{call} = {got:.4g} {unit}; transport.io.allreduce's bandwidth bound gives {want:.4g} {unit}")


def check_formulas(mod: ModuleType) -> list[Check]:
    checks = []
    rng = grading.case_rng("lab5 bus bandwidth")
    drawn = [(rng.randint(2, 64), rng.randint(1, 1 << 26), round(rng.uniform(0.001, 20.0), 4)) for _ in range(2)]
    for n, nbytes, seconds in ((4, 4 << 20, 8.0), (8, 1 << 20, 0.5), (2, 1000, 0.001), *drawn):
        want = bandwidth_bound(n, nbytes, 1.0) * 1e6 / seconds  # the rate at which `seconds` is the bound
        got, err = grading.call(mod, "bus_bandwidth", n, nbytes, seconds)
        if err:
            checks.append(err)
            break
        c = _agrees("bus_bandwidth", got, want, f"bus_bandwidth({n}, {nbytes}, {seconds})", "bit/s")
        if not c.passed:
            checks.append(c)
            break
    else:
        checks.append(grading.passed("bus_bandwidth", "2(n-1)/n * bytes * 8 / seconds, as the transport's "
                                     "bandwidth bound inverted, for 2, 4 and 8 ranks and two drawn from the seed"))
    size, rates = 1 << 16, [40e6, 40e6, 10e6, 40e6]
    nbytes = size * 4
    for n, rs in ((4, [8e6] * 4), (8, [100e6] * 7 + [20e6]), (4, rates)):
        want = bandwidth_bound(n, nbytes, min(rs) / 1e6)
        bound, err = grading.call(mod, "ring_time_bound", n, nbytes, rs)
        if err:
            return [*checks, err]
        c = _agrees("ring_time_bound", bound, want, f"ring_time_bound({n}, {nbytes}, {rs})", "s")
        if not c.passed:
            return [*checks, c]
    took = _sim_ring(4, size, rates)  # `bound` is the last case's: these rates
    checks.append(grading.holds(
        "ring_time_bound: one slow edge", 0.95 * bound <= took <= 1.6 * bound,
        f"a simulated ring with edges at 40, 40, 10 and 40 Mb/s took {took * 1e3:.0f} ms per iteration, "
        f"{took / bound:.2f}x your bound of {bound * 1e3:.0f} ms: the 10 Mb/s edge sets every rank's pace",
        f"a simulated ring with edges at 40, 40, 10 and 40 Mb/s took {took * 1e3:.0f} ms per iteration, "
        f"{took / bound:.2f}x your bound of {bound * 1e3:.0f} ms (expected between 0.95x and 1.6x)"))
    return checks


# ---- rank order -------------------------------------------------------------------------------------


def _groups(topo: Topology) -> dict[str, str]:
    label = "server" if any("server" in h.labels for h in topo.hosts) else "leaf"
    return {h.name: h.labels[label] for h in topo.hosts}


def _scrambled(server_of: dict[str, str], seed: int) -> dict[str, str]:
    keys = list(server_of)
    np.random.default_rng(seed).shuffle(keys)
    return {k: server_of[k] for k in keys}


def crossings(order: list[str], server_of: dict[str, str]) -> int:
    return sum(server_of[a] != server_of[b] for a, b in zip(order, order[1:] + order[:1], strict=True))


def _order_cases() -> list[tuple[str, dict[str, str]]]:
    return [
        ("2 servers of 4 GPUs", _groups(parse_spec("in-server:servers=2,gpus=4"))),
        ("3 servers of 3 GPUs", _groups(parse_spec("in-server:servers=3,gpus=3"))),
        ("4 leaves of 2 hosts", _groups(parse_spec("leaf-spine:spines=2,leaves=4,hosts=2"))),
        # Names that do not give the server away: sorting by name is not enough.
        ("servers of unequal size", {"g1": "s2", "g2": "s1", "g3": "s2", "g4": "s3", "g5": "s2", "g6": "s1"}),
        ("one server", {f"s1g{i}": "s1" for i in range(1, 6)}),
        _drawn_order_case(),
    ]


def _drawn_order_case() -> tuple[str, dict[str, str]]:
    """Hosts on servers drawn from the seed the checker prints: any number, any sizes, names that say
    nothing of the server."""
    rng = grading.case_rng("lab5 ring order")
    hosts = rng.randint(4, 12)
    servers = rng.randint(2, min(4, hosts))
    names = rng.sample(range(100), hosts)
    # Every server gets one host first, so that none is empty; the rest land anywhere.
    placed = list(range(servers)) + [rng.randrange(servers) for _ in range(hosts - servers)]
    rng.shuffle(placed)
    return (f"{hosts} hosts on {servers} servers (drawn)",
            {f"h{n}": f"srv{k + 1}" for n, k in zip(names, placed, strict=True)})


def _student_order(mod: ModuleType, server_of: dict[str, str]) -> tuple[list[str] | None, str | None]:
    order, err = grading.call(mod, "ring_order", dict(server_of))
    if err:
        return None, err.reason
    if not isinstance(order, (list, tuple)) or sorted(map(str, order)) != sorted(server_of):
        return None, f"returned {order!r:.80}, expected a list holding every host once"
    return list(order), None


def edge_rates(topo: Topology, order: list[str]) -> list[float]:
    """Each ring edge's max-min fair rate over the links it crosses, all edges sending at once."""
    flows = [path_weights(topo, a, b) for a, b in zip(order, order[1:] + order[:1], strict=True)]
    return max_min_rates(flows, capacities(topo))


def check_order(mod: ModuleType) -> list[Check]:
    checks = []
    for i, (case, server_of) in enumerate(_order_cases()):
        label = f"ring_order: {case}"
        order, problem = _student_order(mod, _scrambled(server_of, i))
        if problem:
            return [*checks, grading.failed(label, problem)]
        groups = len(set(server_of.values()))
        least = groups if groups > 1 else 0
        got = crossings(order, server_of)  # type: ignore[arg-type]
        checks.append(grading.holds(label, got == least, f"{got} ring edge(s) leave a server, the fewest possible",
                                    f"{got} ring edges leave a server; {least} is enough: {order}"))
    if not all(c.passed for c in checks):
        return checks
    topo = parse_spec("in-server:servers=2,gpus=4")
    server_of = _groups(topo)
    mine, _ = _student_order(mod, _scrambled(server_of, 9))
    other = alternating_order(topo)
    size = 8 * 4096
    t_mine = _sim_ring(len(mine), size, edge_rates(topo, mine))  # type: ignore[arg-type]
    t_other = _sim_ring(len(other), size, edge_rates(topo, other))
    checks.append(grading.holds(
        "ring_order: simulated in-server ring", t_other >= 1.6 * t_mine,
        f"{t_mine * 1e3:.0f} ms per iteration in your order against {t_other * 1e3:.0f} ms in the live view's, "
        f"which alternates servers ({t_other / t_mine:.1f}x slower: its {crossings(other, server_of)} crossing "
        "edges share each server's NIC)",
        f"{t_mine * 1e3:.0f} ms per iteration in your order against {t_other * 1e3:.0f} ms in the live view's "
        "alternating order: expected at least 1.6x faster"))
    return checks


def check_code(target: Path) -> list[Check]:
    mod = grading.load_module(target, CODE)
    if isinstance(mod, Check):
        return [mod]
    return check_schedule(mod) + check_formulas(mod) + check_order(mod)


# ---- results directories ----------------------------------------------------------------------------


def _rank_totals(a: dict[str, Any]) -> str:
    return ", ".join(f"{f['src']} {sum(f.get('iteration_times_s') or [0]):.2f} s"
                     + (f" ({f['retransmissions']} retx)" if f.get("retransmissions") is not None else "")
                     for f in a["flows"])


def _lockstep(name: str, a: dict[str, Any]) -> Check:
    totals = [sum(f.get("iteration_times_s") or []) for f in a["flows"]]
    spread = max(totals) / min(totals) if totals and min(totals) > 0 else None
    c = grading.at_most(f"{name}: ranks in lockstep", spread, 1.2, "slowest / fastest rank's total time")
    return grading.Check(c.name, c.passed, f"{c.reason}: {_rank_totals(a)}")


def _correct(name: str, a: dict[str, Any]) -> Check:
    return grading.holds(f"{name}: result", a.get("correct") is True, "every rank's sum equals numpy's, bit for bit",
                         "a rank's sum differs from numpy's, or a rank did not finish")


def check_in_server(doc: dict[str, Any]) -> list[Check]:
    # The median: a mean moves with one slow reply, and a minimum with whether any ping found the
    # switches' daemons awake (local 45-200 µs over runs of one machine, once above the ToR's).
    # Results written before the median was kept give their means.
    rtts = {m: in_server.ping_latency(grading.arm(doc, in_server.ping_arm(m))) for m in in_server.ROUTES}
    lat = {m: r["rtt_p50_s"] or r["rtt_avg_s"] for m, r in rtts.items()}
    ar = {m: grading.arm(doc, in_server.allreduce_arm(m)) for m in in_server.ROUTES}
    checks = []
    ratio = lat["local"] / lat["via-tor"] if lat["local"] and lat["via-tor"] else None
    checks.append(grading.at_most("ping: local vs via the ToR", ratio, 0.9,
                                  "median RTT through the local switch / via the ToR hairpin"))
    t = {m: a.get("iteration_s") for m, a in ar.items()}
    ratio = t["local"] / t["via-tor"] if t["local"] and t["via-tor"] else None
    checks.append(grading.at_most("all-reduce: local vs via the ToR", ratio, 0.6,
                                  "seconds per iteration through the local switch / via the ToR"))
    params = doc["topology"].get("params") or {}
    via = ar["via-tor"]
    n = len(via["flows"])
    nbytes = max((f.get("bytes") or 0) for f in via["flows"]) if via["flows"] else 0
    # Via the ToR every ring edge goes up the server's NIC and back down it: n edges share its rate.
    nic_share_mbps = (params.get("nic_rate") or 0) * (params.get("nics_per_server") or 1) / max(1, n)
    floor = bandwidth_bound(n, nbytes, nic_share_mbps)
    ratio = t["via-tor"] / floor if t["via-tor"] and floor else None
    checks.append(grading.at_least("all-reduce via the ToR: NIC share", ratio, 0.9,
                                   f"seconds per iteration / the bound at 1/{n} of the NIC each"))
    checks += [_correct(in_server.allreduce_arm(m), a) for m, a in ar.items()]
    return checks


def check_allreduce(doc: dict[str, Any]) -> list[Check]:
    checks = []
    for name in allreduce.ARMS:
        a = grading.arm(doc, name)
        checks.append(_correct(name, a))
        ratio = a.get("ratio_to_bound")
        checks.append(grading.at_least(f"{name}: the link's limit", ratio, 0.95,
                                       "seconds per iteration / the bandwidth bound"))
        if not a.get("faults"):
            checks.append(grading.at_most(f"{name}: near the bound", ratio, 2.5,
                                          "seconds per iteration / the bandwidth bound"))
        checks.append(_lockstep(name, a))
    return checks


def check_results(target: Path) -> list[Check]:
    graders = {"in-server": check_in_server, "allreduce": check_allreduce}
    single = (target / "results.json").is_file() or target.name == "results.json"
    checks, missing = [], []
    for exp, grade in graders.items():
        try:
            doc = grading.load_results(target, exp)
        except LabError as exc:
            missing.append((exp, exc))
            continue
        checks += grade(doc)
    if len(missing) == len(graders) or (single and not checks):
        raise missing[0][1]
    if not single:
        checks += [grading.failed(f"{exp} results", str(exc)) for exp, exc in missing]
    return checks


def check(target: Path) -> list[Check]:
    return check_code(target) if grading.is_code_dir(target) else check_results(target)
