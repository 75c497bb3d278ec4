"""The OpenFlow 1.3 app: installs the rules of `rules.py` proactively, answers ARP, follows port state,
polls port counters, and serves the HTTP API.

Threads: the framework delivers every OpenFlow event on the app's own event thread; the HTTP API and
the counter poller run in their own threads. All shared state and every send is guarded by one lock.
A rule change is a *job*: flow mods to the switches whose rules changed, then one barrier per switch;
the job is done when every barrier reply is back (that is the time recorded for a reroute).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from emulator.controller import compat
from emulator.controller.api import ApiServer
from emulator.controller.compat import (
    CONFIG_DISPATCHER,
    DEAD_DISPATCHER,
    MAIN_DISPATCHER,
    ofp_event,
    ofproto_v1_3,
    set_ev_cls,
)
from emulator.controller.rules import (
    CONTROLLER,
    IN_PORT,
    FlowEntry,
    GotoTable,
    Multipath,
    Output,
    RuleDiff,
    WriteNextHopSet,
    compute_rules,
    describe,
    diff_rules,
    mode_error,
)
from emulator.controller.stats import PortTable, link_report
from emulator.controller.unix_listener import listen_unix, serve_unix
from topologies.model import Link, Topology

log = logging.getLogger(__name__)

METADATA_MASK = 0xFFFF_FFFF_FFFF_FFFF
MAX_EVENTS = 10_000


@dataclass
class ControllerConfig:
    topology: Topology
    mode: str = "ecmp"
    api_host: str = "127.0.0.1"
    api_port: int = 0
    poll_interval: float = 0.5
    # Also accept OpenFlow on this unix socket (switches in namespaces of their own use it).
    of_socket: str | None = None
    # How long PUT /mode waits for the barriers of the new generation.
    barrier_timeout: float = 10.0


@dataclass
class Job:
    """One round of rule changes, done when every barrier it sent has been answered."""

    kind: str
    generation: int
    started: float = field(default_factory=time.perf_counter)
    pending: set[tuple[int, int]] = field(default_factory=set)  # (dpid, barrier xid)
    switches: list[str] = field(default_factory=list)
    flow_mods: int = 0
    took_ms: float | None = None
    done: threading.Event = field(default_factory=threading.Event)
    on_done: list[Callable[[Job], None]] = field(default_factory=list)

    def finish(self) -> None:
        self.took_ms = round((time.perf_counter() - self.started) * 1000, 3)
        self.done.set()
        for cb in self.on_done:
            try:
                cb(self)
            except Exception:
                log.exception("job callback failed")


def _guarded(handler: Callable) -> Callable:
    """Log a handler's exception instead of letting it escape: with os-ken's native threads an
    exception leaving a handler ends the app's event loop for good."""

    @functools.wraps(handler)
    def wrapper(self: Any, ev: Any) -> None:
        try:
            handler(self, ev)
        except Exception:
            log.exception("%s failed", handler.__name__)

    return wrapper


class FabricController(compat.BaseApp):
    OFP_VERSIONS: ClassVar[list[int]] = [ofproto_v1_3.OFP_VERSION]
    # Set by __main__ before the framework instantiates the app (it passes no arguments of ours).
    config: ClassVar[ControllerConfig | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.config is None:
            raise RuntimeError("FabricController.config must be set before the app is started")
        cfg = self.config
        self.topo = cfg.topology
        self.mode = cfg.mode
        self.lock = threading.RLock()
        self.generation = 1
        self.stopping = threading.Event()

        self.switch_by_dpid = {n.dpid: n.name for n in self.topo.switches}
        self.host_by_ip = {h.address: h for h in self.topo.hosts if h.address}
        # (dpid, port) -> links that end there (switch ends only)
        self.links_at: dict[tuple[int, int], list[Link]] = {}
        for lk in self.topo.links:
            for end in (lk.a, lk.b):
                node = self.topo.node(end)
                if node.is_switch:
                    self.links_at.setdefault((node.dpid, lk.port(end)), []).append(lk)

        self.datapaths: dict[int, Any] = {}
        self.installed: dict[int, dict[tuple, FlowEntry]] = {}
        self.synced: set[int] = set()
        self.ports_down: set[tuple[int, int]] = set()
        self.down: set[Link] = set()
        self.barriers: dict[tuple[int, int], Job] = {}
        self.counters = PortTable()
        self._events: list[dict[str, Any]] = []
        self._rules_cache: tuple[tuple, dict[str, tuple[FlowEntry, ...]]] | None = None
        # Seconds between a port's status change and the reroute it causes: 0 is this controller's own
        # ~30 ms; real fabrics take from a few hundred ms (link-down detection, BFD) to seconds (routing
        # convergence), which is what a path-aware transport is measured against (see api_set_reaction_delay).
        self.reaction_delay = 0.0
        self.api = ApiServer(self, cfg.api_host, cfg.api_port)

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> Any:
        thread = super().start()
        self.api.start()
        if self.config is not None and self.config.of_socket:
            srv = listen_unix(Path(self.config.of_socket))
            compat.spawn(serve_unix, srv, compat.controller.datapath_connection_factory, compat.spawn,
                         self.stopping.is_set)
        compat.spawn(self._poll_loop)
        log.info(
            "controller for %s: %d switches, %d hosts, mode %s",
            self.topo.name,
            len(self.switch_by_dpid),
            len(self.host_by_ip),
            self.mode,
        )
        return thread

    def shutdown(self) -> None:
        """Stop polling and close the API socket (the process exits right after)."""
        self.stopping.set()
        try:
            self.api.close()
        except Exception:
            log.exception("closing the API failed")

    # -- rule computation and installation -----------------------------------------------------------
    def _rules(self) -> dict[str, tuple[FlowEntry, ...]]:
        key = (self.mode, frozenset(self.down))
        if self._rules_cache is None or self._rules_cache[0] != key:
            self._rules_cache = (key, compute_rules(self.topo, self.mode, self.down))
        return self._rules_cache[1]

    def _sync(self, kind: str, dpids: list[int] | None = None, started: float | None = None) -> Job:
        """Bring the given (default: all connected) switches to the current rules. Caller holds the lock."""
        job = Job(kind, self.generation)
        if started is not None:
            job.started = started
        rules = self._rules()
        for dpid in dpids if dpids is not None else sorted(self.datapaths):
            dp = self.datapaths.get(dpid)
            if dp is None:
                continue
            name = self.switch_by_dpid[dpid]
            new = rules[name]
            diff = diff_rules(self.installed.get(dpid, {}).values(), new)
            if not diff:
                continue
            self._send_diff(dp, diff)
            self.installed[dpid] = {f.key: f for f in new}
            xid = self._send_barrier(dp)
            job.pending.add((dpid, xid))
            self.barriers[(dpid, xid)] = job
            job.switches.append(name)
            job.flow_mods += len(diff)
        if not job.pending:
            job.finish()
        return job

    def _send_diff(self, dp: Any, diff: RuleDiff) -> None:
        # Adds replace entries with the same match in place; deletes remove what the new rules lack.
        # OVS applies the messages of one connection in order, so no packet sees a half state.
        for f in diff.add:
            dp.send_msg(self._flow_mod(dp, f))
        for f in diff.delete:
            dp.send_msg(self._flow_mod(dp, f, delete=True))

    def _flow_mod(self, dp: Any, f: FlowEntry, delete: bool = False) -> Any:
        ofp, parser = dp.ofproto, dp.ofproto_parser
        match = parser.OFPMatch(**f.match_dict())
        if delete:
            return parser.OFPFlowMod(
                dp,
                table_id=f.table,
                command=ofp.OFPFC_DELETE_STRICT,
                priority=f.priority,
                match=match,
                out_port=ofp.OFPP_ANY,
                out_group=ofp.OFPG_ANY,
            )
        apply: list[Any] = []
        metadata: int | None = None
        goto: int | None = None
        for a in f.actions:
            if isinstance(a, Output):
                if a.port == CONTROLLER:
                    apply.append(parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER))
                elif a.port == IN_PORT:
                    apply.append(parser.OFPActionOutput(ofp.OFPP_IN_PORT))
                else:
                    apply.append(parser.OFPActionOutput(int(a.port)))
            elif isinstance(a, Multipath):
                apply.append(
                    parser.NXActionMultipath(
                        fields=compat.NX_HASH_FIELDS_SYMMETRIC_L3L4_UDP,
                        basis=a.basis,
                        algorithm=compat.nicira_ext.NX_MP_ALG_HRW,
                        max_link=a.n_links - 1,  # the wire field is "number of links minus one"
                        arg=0,
                        ofs_nbits=compat.nicira_ext.ofs_nbits(0, 15),
                        dst="reg0",
                    )
                )
            elif isinstance(a, WriteNextHopSet):
                metadata = a.set_id
            elif isinstance(a, GotoTable):
                goto = a.table
        # OVS insists on the spec's instruction order: apply-actions, write-metadata, goto-table.
        inst: list[Any] = []
        if apply:
            inst.append(parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, apply))
        if metadata is not None:
            inst.append(parser.OFPInstructionWriteMetadata(metadata, METADATA_MASK))
        if goto is not None:
            inst.append(parser.OFPInstructionGotoTable(goto))
        return parser.OFPFlowMod(
            dp,
            cookie=self.generation,
            table_id=f.table,
            command=ofp.OFPFC_ADD,
            priority=f.priority,
            match=match,
            instructions=inst,
        )

    def _send_barrier(self, dp: Any) -> int:
        msg = dp.ofproto_parser.OFPBarrierRequest(dp)
        xid = dp.set_xid(msg)
        dp.send_msg(msg)
        return xid

    def _record(self, kind: str, **info: Any) -> dict[str, Any]:
        event = {"time": time.time(), "kind": kind, **info}
        self._events.append(event)
        del self._events[:-MAX_EVENTS]
        return event

    def _track(self, job: Job, event: dict[str, Any], what: str) -> None:
        """Fill the event in (and log) when the job's barriers are back."""

        def done(j: Job) -> None:
            with self.lock:
                event.update(
                    took_ms=j.took_ms,
                    generation=j.generation,
                    switches_updated=j.switches,
                    flow_mods=j.flow_mods,
                )
            log.info(
                "%s: rules confirmed in %.1f ms (generation %d, %d flow mods on %s)",
                what,
                j.took_ms,
                j.generation,
                j.flow_mods,
                ", ".join(j.switches) or "no switch",
            )

        job.on_done.append(done)
        if job.done.is_set():
            done(job)

    # -- switches ----------------------------------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    @_guarded
    def _on_features(self, ev: Any) -> None:
        dp = ev.msg.datapath
        # os-ken's own handler sets dp.id from this same reply, but on another event loop: on a slow
        # machine (the VM under TCG) ours can run first and find it still None.
        if dp.id is None:
            dp.id = ev.msg.datapath_id
        ofp, parser = dp.ofproto, dp.ofproto_parser
        name = self.switch_by_dpid.get(dp.id)
        if name is None:
            log.warning("switch %#x at %s is not in topology %s; ignoring it", dp.id, dp.address, self.topo.name)
            return
        with self.lock:
            self.datapaths[dp.id] = dp
            self.synced.discard(dp.id)
            # Start from an empty switch: whatever an earlier run left behind goes.
            dp.send_msg(
                parser.OFPFlowMod(
                    dp,
                    table_id=ofp.OFPTT_ALL,
                    command=ofp.OFPFC_DELETE,
                    out_port=ofp.OFPP_ANY,
                    out_group=ofp.OFPG_ANY,
                    match=parser.OFPMatch(),
                )
            )
            self.installed[dp.id] = {}
            # The port states come back before the barrier below (replies are in order), so a port
            # that is already down is accounted for before the switch counts as ready.
            dp.send_msg(parser.OFPPortDescStatsRequest(dp, 0))
            job = self._sync("switch_connected", [dp.id])
            event = self._record("switch_connected", switch=name, dpid=dp.id, address=list(dp.address))

            def synced(_: Job, dpid: int = dp.id) -> None:
                with self.lock:
                    if dpid in self.datapaths:
                        self.synced.add(dpid)
                    ready = self._ready()
                if ready:
                    log.info("fabric ready: %d switches connected and programmed", len(self.synced))
                    with self.lock:
                        self._record("ready", generation=self.generation)

            job.on_done.append(synced)
            self._track(job, event, f"switch {name} ({dp.id:#x}) connected")

    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    @_guarded
    def _on_state_change(self, ev: Any) -> None:
        dp = ev.datapath
        if ev.state != DEAD_DISPATCHER or dp.id is None:
            return
        with self.lock:
            if self.datapaths.get(dp.id) is not dp:
                return  # an old connection of a switch that has reconnected since
            del self.datapaths[dp.id]
            self.installed.pop(dp.id, None)
            self.synced.discard(dp.id)
            for key in [k for k in self.barriers if k[0] == dp.id]:
                job = self.barriers.pop(key)
                job.pending.discard(key)
                if not job.pending:
                    job.finish()
            name = self.switch_by_dpid.get(dp.id)
            self._record("switch_disconnected", switch=name, dpid=dp.id)
        log.warning("switch %s (%#x) disconnected", name, dp.id)

    # Replies to what _on_features sends may arrive while os-ken still holds the switch in CONFIG: when
    # the controller's handler ran before os-ken's own, they overtake os-ken's port request, whose reply
    # is what moves the switch to MAIN.
    @set_ev_cls(ofp_event.EventOFPBarrierReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    @_guarded
    def _on_barrier(self, ev: Any) -> None:
        key = (ev.msg.datapath.id, ev.msg.xid)
        with self.lock:
            job = self.barriers.pop(key, None)
            if job is None:
                return
            job.pending.discard(key)
            if job.pending:
                return
        job.finish()

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    @_guarded
    def _on_error(self, ev: Any) -> None:
        msg = ev.msg
        log.error(
            "switch %s reports OpenFlow error type=%d code=%d for xid %d: %s",
            self.switch_by_dpid.get(msg.datapath.id, msg.datapath.id),
            msg.type,
            msg.code,
            msg.xid,
            bytes(msg.data[:64]).hex(),
        )

    # -- link state ---------------------------------------------------------------------------------
    def _set_port(self, dpid: int, port: int, is_down: bool) -> list[Link]:
        """Record a port's state; return the links whose up/down state changed. Caller holds the lock."""
        key = (dpid, port)
        if is_down == (key in self.ports_down):
            return []
        if is_down:
            self.ports_down.add(key)
        else:
            self.ports_down.discard(key)
        changed = []
        for lk in self.links_at.get(key, []):
            ends = [(n.dpid, lk.port(n.name)) for n in map(self.topo.node, (lk.a, lk.b)) if n.is_switch]
            now_down = any(e in self.ports_down for e in ends)
            if now_down != (lk in self.down):
                (self.down.add if now_down else self.down.discard)(lk)
                changed.append(lk)
        return changed

    def _links_changed(self, changes: list[tuple[Link, int]], dpid: int, started: float) -> None:
        """Reroute after link state changes ((link, port on dpid) pairs). Caller holds the lock."""
        self.generation += 1
        job = self._sync("reroute", started=started)
        switch = self.switch_by_dpid.get(dpid)
        for lk, port in changes:
            kind = "link_down" if lk in self.down else "link_up"
            log.info("%s %s (switch %s port %d)", kind, lk.name, switch, port)
            event = self._record(
                kind, link=lk.name, switch=switch, dpid=dpid, port=port, down_links=sorted(x.name for x in self.down)
            )
            self._track(job, event, f"{kind} {lk.name}")

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    @_guarded
    def _on_port_status(self, ev: Any) -> None:
        started = time.perf_counter()
        msg = ev.msg
        dp, ofp, desc = msg.datapath, msg.datapath.ofproto, msg.desc
        is_down = bool(
            msg.reason == ofp.OFPPR_DELETE or desc.state & ofp.OFPPS_LINK_DOWN or desc.config & ofp.OFPPC_PORT_DOWN
        )
        log.debug(
            "port status %s port %d reason %d down=%s",
            self.switch_by_dpid.get(dp.id),
            desc.port_no,
            msg.reason,
            is_down,
        )
        delay = self.reaction_delay
        if delay > 0:
            # Events keep their order: each waits the same time.
            compat.spawn(self._port_changed_later, delay, dp.id, desc.port_no, is_down, started)
            return
        self._port_changed(dp.id, desc.port_no, is_down, started)

    def _port_changed_later(self, delay: float, dpid: int, port: int, is_down: bool, started: float) -> None:
        if not self.stopping.wait(delay):
            self._port_changed(dpid, port, is_down, started)

    def _port_changed(self, dpid: int, port: int, is_down: bool, started: float) -> None:
        with self.lock:
            changed = self._set_port(dpid, port, is_down)
            if changed:
                self._links_changed([(lk, port) for lk in changed], dpid, started)

    @set_ev_cls(ofp_event.EventOFPPortDescStatsReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    @_guarded
    def _on_port_desc(self, ev: Any) -> None:
        started = time.perf_counter()
        dp = ev.msg.datapath
        ofp = dp.ofproto
        with self.lock:
            if self.datapaths.get(dp.id) is not dp:
                return  # a switch ignored as foreign, or an old connection
            changed: list[tuple[Link, int]] = []
            for p in ev.msg.body:
                if p.port_no > ofp.OFPP_MAX:
                    continue
                is_down = bool(p.state & ofp.OFPPS_LINK_DOWN or p.config & ofp.OFPPC_PORT_DOWN)
                changed += [(lk, p.port_no) for lk in self._set_port(dp.id, p.port_no, is_down)]
            if changed:
                self._links_changed(changed, dp.id, started)

    # -- ARP ------------------------------------------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    @_guarded
    def _on_packet_in(self, ev: Any) -> None:
        msg = ev.msg
        dp = msg.datapath
        pkt = compat.packet.Packet(msg.data)
        req = pkt.get_protocol(compat.arp.arp)
        if req is None or req.opcode != compat.arp.ARP_REQUEST:
            return
        target = self.host_by_ip.get(req.dst_ip)
        if target is None or req.src_ip == req.dst_ip:
            return  # not one of ours, or a gratuitous ARP
        reply = compat.packet.Packet()
        reply.add_protocol(
            compat.ethernet.ethernet(
                ethertype=compat.ethernet.ether.ETH_TYPE_ARP,
                dst=req.src_mac,
                src=target.mac,
            )
        )
        reply.add_protocol(
            compat.arp.arp(
                opcode=compat.arp.ARP_REPLY,
                src_mac=target.mac,
                src_ip=req.dst_ip,
                dst_mac=req.src_mac,
                dst_ip=req.src_ip,
            )
        )
        reply.serialize()
        ofp, parser = dp.ofproto, dp.ofproto_parser
        out = parser.OFPPacketOut(
            dp,
            buffer_id=ofp.OFP_NO_BUFFER,
            in_port=msg.match["in_port"],
            actions=[parser.OFPActionOutput(ofp.OFPP_IN_PORT)],
            data=reply.data,
        )
        with self.lock:
            dp.send_msg(out)
        log.debug(
            "proxy ARP on %s: %s is-at %s (asked by %s)",
            self.switch_by_dpid.get(dp.id),
            req.dst_ip,
            target.mac,
            req.src_ip,
        )

    # -- counters ------------------------------------------------------------------------------------
    def _poll_loop(self) -> None:
        interval = self.config.poll_interval if self.config else 0.5
        while not self.stopping.wait(interval):
            try:
                with self.lock:
                    for dp in list(self.datapaths.values()):
                        parser, ofp = dp.ofproto_parser, dp.ofproto
                        dp.send_msg(parser.OFPPortStatsRequest(dp, 0, ofp.OFPP_ANY))
            except Exception:
                log.exception("port statistics request failed")

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    @_guarded
    def _on_port_stats(self, ev: Any) -> None:
        now = time.time()
        dpid = ev.msg.datapath.id
        with self.lock:
            for s in ev.msg.body:
                self.counters.update(
                    dpid,
                    s.port_no,
                    now,
                    {
                        "rx_packets": s.rx_packets,
                        "tx_packets": s.tx_packets,
                        "rx_bytes": s.rx_bytes,
                        "tx_bytes": s.tx_bytes,
                        "rx_dropped": s.rx_dropped,
                        "tx_dropped": s.tx_dropped,
                        "rx_errors": s.rx_errors,
                        "tx_errors": s.tx_errors,
                    },
                    uptime=s.duration_sec + s.duration_nsec / 1e9,
                )

    # -- API backend (api_* names: nothing may clash with the framework app's attributes) -------------
    def _ready(self) -> bool:
        expected = set(self.switch_by_dpid)
        return expected <= set(self.datapaths) and expected <= self.synced and not self.barriers

    def api_health(self) -> dict[str, Any]:
        with self.lock:
            return {
                "ready": self._ready(),
                "switches_expected": len(self.switch_by_dpid),
                "switches_connected": sorted(self.datapaths),
                "switches_missing": sorted(
                    name for dpid, name in self.switch_by_dpid.items() if dpid not in self.datapaths
                ),
                "mode": self.mode,
                "generation": self.generation,
                "topology": self.topo.name,
                "framework": compat.FRAMEWORK,
                "links_down": sorted(lk.name for lk in self.down),
            }

    def api_links(self) -> dict[str, Any]:
        with self.lock:
            return link_report(self.topo, self.counters, self.down, time.time())

    def api_ports(self) -> dict[str, Any]:
        with self.lock:
            out = []
            for (dpid, _), pc in sorted(self.counters.ports.items()):
                d = pc.to_dict()
                d["switch"] = self.switch_by_dpid.get(dpid)
                d["links"] = [lk.name for lk in self.links_at.get((dpid, pc.port), [])]
                d["up"] = (dpid, pc.port) not in self.ports_down
                out.append(d)
            return {"time": time.time(), "ports": out}

    def api_events(self) -> list[dict[str, Any]]:
        with self.lock:
            return [dict(e) for e in self._events]

    def api_get_mode(self) -> dict[str, Any]:
        with self.lock:
            return {"mode": self.mode, "generation": self.generation}

    def api_set_mode(self, mode: Any) -> dict[str, Any]:
        if (err := mode_error(mode)) is not None:
            raise ValueError(err)
        with self.lock:
            previous = self.mode
            self.mode = mode
            if mode != previous:
                self.generation += 1
            job = self._sync("mode")
            event = self._record("mode", mode=mode, previous=previous)
            self._track(job, event, f"mode {previous} -> {mode}")
        if not job.done.wait(self.config.barrier_timeout if self.config else 10.0):
            raise TimeoutError(f"switches did not confirm mode {mode} within the barrier timeout")
        return {
            "mode": mode,
            "previous": previous,
            "generation": job.generation,
            "took_ms": job.took_ms,
            "flow_mods": job.flow_mods,
            "switches_updated": job.switches,
        }

    def api_get_reaction_delay(self) -> dict[str, Any]:
        return {"seconds": self.reaction_delay}

    def api_set_reaction_delay(self, seconds: Any) -> dict[str, Any]:
        """How long after a link's state changes the controller reroutes (0 to 10 s)."""
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds <= 10:
            raise ValueError("reaction delay: give seconds from 0 to 10")
        previous, self.reaction_delay = self.reaction_delay, float(seconds)
        self._record("reaction_delay", seconds=self.reaction_delay, previous=previous)
        return {"seconds": self.reaction_delay, "previous": previous}

    def api_rules(self, switch: str | None) -> dict[str, Any]:
        with self.lock:
            rules = self._rules()
            if switch is not None:
                return {"mode": self.mode, "generation": self.generation, "switches": {switch: describe(rules[switch])}}
            return {
                "mode": self.mode,
                "generation": self.generation,
                "switches": {name: describe(flows) for name, flows in rules.items()},
            }
