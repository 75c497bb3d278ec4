"""The controller's flow tables, executed: where a switch sends a packet under the entries that
`emulator.controller.rules.compute_rules` gives it.

This is the simulated engine's forwarding. It does not reimplement routing: it runs the very entries
the controller installs on the live switches (made by the same code, `rules.LazyRules`, one
destination at a time) (table 0 by destination, the multipath hash into reg0
and the next-hop set into the metadata, table 1's buckets and spray's EV entries, via-tor's in_port
entries and hairpins), with the highest-priority match winning as in OpenFlow. Open vSwitch's hash
is `emulator.controller.ovs_multipath`'s, checked against `ovs-appctl ofproto/trace`, so a flow takes
the same path here as on the live fabric.

Only IPv4 unicast is asked about (the transport's UDP and the TCP baseline); ARP, IPv6 and the table
miss are entries that drop or go to the controller, which here means "no output".
"""

from __future__ import annotations

from dataclasses import dataclass

from emulator.controller.rules import (
    ETH_IPV4,
    IN_PORT,
    TABLE_FORWARD,
    TABLE_NEXT_HOP,
    FlowEntry,
    GotoTable,
    LazyRules,
    MatchValue,
    Multipath,
    Output,
    WriteNextHopSet,
)

# A header: (source address, destination address, protocol, source port, destination port).
Key = tuple[str, str, int, int, int]
IPPROTO_TCP = 6
IPPROTO_UDP = 17


@dataclass
class _Packet:
    key: Key
    in_port: int
    metadata: int = 0
    reg0: int | None = None
    multipath: Multipath | None = None  # reg0 is hashed when a match first needs it

    def field(self, name: str) -> int | str | None:
        src, dst, proto, sport, dport = self.key
        if name == "eth_type":
            return ETH_IPV4
        if name == "ipv4_dst":
            return dst
        if name == "ipv4_src":
            return src
        if name == "in_port":
            return self.in_port
        if name == "ip_proto":
            return proto
        if name in ("udp_src", "tcp_src"):
            return sport if proto == (IPPROTO_UDP if name == "udp_src" else IPPROTO_TCP) else None
        if name in ("udp_dst", "tcp_dst"):
            return dport if proto == (IPPROTO_UDP if name == "udp_dst" else IPPROTO_TCP) else None
        if name == "metadata":
            return self.metadata
        if name == "reg0":
            if self.reg0 is None and self.multipath is not None:
                self.reg0 = self.multipath.link(src, dst, proto, sport, dport)
            return self.reg0
        raise KeyError(name)


class _Classifier:
    """Entries grouped by the fields (and masks) they match, each group a dict of the masked values they
    want: a tuple space search, as Open vSwitch's classifier does, so a lookup costs a dict probe per
    group, not a pass over the entries (a spray set at a k=16 fat-tree's aggregation switch has 128
    EV entries). Groups are tried highest priority first, and a group below the best match found is not
    tried at all: spray's EV entries outrank the hash buckets, so the hash is never computed for them."""

    def __init__(self, entries: list[FlowEntry]) -> None:
        groups: dict[tuple, dict[tuple, FlowEntry]] = {}
        for e in entries:
            shape = tuple((name, want[1] if isinstance(want, tuple) else None) for name, want in e.match)
            values = tuple(want[0] & want[1] if isinstance(want, tuple) else want for _, want in e.match)
            group = groups.setdefault(shape, {})
            old = group.get(values)
            if old is None or e.priority > old.priority:
                group[values] = e
        self.groups = sorted(((max(e.priority for e in g.values()), shape, g) for shape, g in groups.items()),
                             key=lambda t: -t[0])

    def lookup(self, pkt: _Packet) -> FlowEntry | None:
        best: FlowEntry | None = None
        for top, shape, group in self.groups:
            if best is not None and best.priority >= top:
                break
            key = []
            for name, mask in shape:
                have = pkt.field(name)
                if have is None or (mask is not None and not isinstance(have, int)):
                    break
                key.append(have & mask if mask is not None else have)  # type: ignore[operator]
            else:
                e = group.get(tuple(key))
                if e is not None and (best is None or e.priority > best.priority):
                    best = e
        return best


# Classifiers kept per switch (one per destination or next-hop set in use). On a k=32 fat-tree a sprayed
# permutation reaches ~300 switches per destination, 2.4 million classifiers in all: kept, they took
# most of 19 GB.
CACHED_TABLES = 512


class FlowTables:
    """One switch's entries, as the controller would install them (rules.LazyRules: those toward a
    destination are made when a packet first goes there), highest priority first."""

    def __init__(self, rules: LazyRules, switch: str) -> None:
        self.rules = rules
        self.switch = switch
        self._tables: dict[tuple[int, MatchValue], _Classifier] = {}

    def _table(self, table: int, pkt: _Packet) -> _Classifier:
        key = (table, pkt.key[1] if table == TABLE_FORWARD else pkt.metadata)
        got = self._tables.get(key)
        if got is None:
            if len(self._tables) >= CACHED_TABLES:
                self._tables.clear()  # bounded: the network caches whole routes, these only speed up making them
            entries = (self.rules.toward(self.switch, pkt.key[1]) if table == TABLE_FORWARD
                       else self.rules.next_hop_set(self.switch, pkt.metadata) if table == TABLE_NEXT_HOP else [])
            got = self._tables[key] = _Classifier(entries)
        return got

    def output(self, key: Key, in_port: int) -> int | None:
        """The port a packet with header `key` that came in on `in_port` leaves by; None: dropped (the
        table miss, which is every switch's lowest entry)."""
        pkt = _Packet(key, in_port)
        table = TABLE_FORWARD
        for _ in range(4):  # table 0, then at most table 1
            entry = self._table(table, pkt).lookup(pkt)
            if entry is None or not entry.actions:
                return None
            goto = None
            for action in entry.actions:
                if isinstance(action, Output):
                    if action.port == IN_PORT:
                        return in_port
                    return action.port if isinstance(action.port, int) else None
                if isinstance(action, Multipath):
                    pkt.multipath, pkt.reg0 = action, None
                elif isinstance(action, WriteNextHopSet):
                    pkt.metadata = action.set_id
                elif isinstance(action, GotoTable):
                    goto = action.table
            if goto is None:
                return None
            table = goto
        return None
