"""Open vSwitch's `multipath` action, link choice reproduced bit for bit (pure: no OVS needed).

The controller's ECMP entries run `multipath(symmetric_l3l4+udp, basis, hrw, n_links, 0, reg0[0..15])`;
a simulated fabric that puts each flow on the link this module returns puts it where the live fabric's
OVS does. What OVS computes, and where (openvswitch/ovs, unchanged from v3.1.0, the Debian 12 package,
up to the newest tags):

- lib/multipath.c `multipath_execute`: hash = `flow_hash_fields(flow, fields, basis)`, then
  `multipath_algorithm(hash, algorithm, max_link + 1, arg)`, loaded into the destination register.
- lib/flow.c `flow_hash_fields` and the `flow_hash_symmetric_*` functions it calls.
- lib/hash.h: `hash_add` / `hash_finish` are murmur3 steps (`mhash_*`) on builds without SSE4.2. With
  SSE4.2 enabled at compile time they are CRC32C instructions instead and every result differs; the
  Debian and Ubuntu packages target baseline x86-64 (their ovs-vswitchd holds no crc32 instruction),
  and that build is the one mirrored here.
- lib/jhash.c `jhash_bytes` (Bob Jenkins' lookup3) for the fields hashed as byte strings.

OVS hashes header fields as they lie in `struct flow`, in network byte order, read back as host words;
on a little-endian host a 32-bit address 10.0.0.1 is hashed as 0x0100000a. All arithmetic is C's
unsigned 32-bit: every product and sum is reduced with `& M32`. VLAN tags, fragments and non-IP
packets are not modelled (the fabric carries none of them): a flow here is an unfragmented,
untagged IPv4 or IPv6 packet.
"""

from __future__ import annotations

import functools
import ipaddress

M32 = 0xFFFFFFFF

# enum nx_hash_fields (include/openflow/nicira-ext.h): a name's position is its value on the wire.
FIELDS = ("eth_src", "symmetric_l4", "symmetric_l3l4", "symmetric_l3l4+udp", "nw_src", "nw_dst", "symmetric_l3")
# enum nx_mp_algorithm, likewise.
ALGORITHMS = ("modulo_n", "hash_threshold", "hrw", "iter_hash")

ETH_TYPE_IP = 0x0800
ETH_TYPE_IPV6 = 0x86DD
IPPROTO_TCP = 6
IPPROTO_UDP = 17
IPPROTO_SCTP = 132
MAX_LINKS = 65536  # multipath_parse's limit (the wire field max_link is 16 bits)
HRW_MAX_LINKS = 64  # above this, OVS's hrw falls back to iter_hash

Address = str | int | ipaddress.IPv4Address | ipaddress.IPv6Address
ZERO_MAC = "00:00:00:00:00:00"


# -- lib/hash.h, the build without SSE4.2 ----------------------------------------------------------
def hash_rot(x: int, k: int) -> int:
    """hash_rot: rotate a 32-bit word left by k."""
    return ((x << k) | (x >> (32 - k))) & M32


def hash_add(h: int, data: int) -> int:
    """hash_add -> mhash_add: one murmur3 block. mhash_add__ skips the mixing of a zero word (the
    result is the same: murmur's mixing maps 0 to 0), the rotate-multiply-add of `h` always runs."""
    if data:
        data = hash_rot((data * 0xCC9E2D51) & M32, 15) * 0x1B873593 & M32
        h ^= data
    return (hash_rot(h, 13) * 5 + 0xE6546B64) & M32


def hash_add64(h: int, data: int) -> int:
    """hash_add64: the low 32-bit half first (the uint32_t argument truncates), then the high half."""
    return hash_add(hash_add(h, data & M32), data >> 32)


def hash_finish(h: int, final: int) -> int:
    """hash_finish -> mhash_finish(h ^ final): murmur3's fmix32."""
    h ^= final
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def hash_2words(x: int, y: int) -> int:
    """hash_2words: `x` as the basis, a zero word, then `y` (hash_int(x, basis) is hash_2words(x, basis))."""
    return hash_finish(hash_add(hash_add(x, 0), y), 8)


# -- lib/jhash.c --------------------------------------------------------------------------------------
def _jhash_mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    """jhash_mix (lookup3's mix())."""
    a = ((a - c) & M32) ^ hash_rot(c, 4)
    c = (c + b) & M32
    b = ((b - a) & M32) ^ hash_rot(a, 6)
    a = (a + c) & M32
    c = ((c - b) & M32) ^ hash_rot(b, 8)
    b = (b + a) & M32
    a = ((a - c) & M32) ^ hash_rot(c, 16)
    c = (c + b) & M32
    b = ((b - a) & M32) ^ hash_rot(a, 19)
    a = (a + c) & M32
    c = ((c - b) & M32) ^ hash_rot(b, 4)
    b = (b + a) & M32
    return a, b, c


def _jhash_final(a: int, b: int, c: int) -> int:
    """jhash_final (lookup3's final()); only `c` is the result."""
    c = ((c ^ b) - hash_rot(b, 14)) & M32
    a = ((a ^ c) - hash_rot(c, 11)) & M32
    b = ((b ^ a) - hash_rot(a, 25)) & M32
    c = ((c ^ b) - hash_rot(b, 16)) & M32
    a = ((a ^ c) - hash_rot(c, 4)) & M32
    b = ((b ^ a) - hash_rot(a, 14)) & M32
    return ((c ^ b) - hash_rot(b, 24)) & M32


def jhash_bytes(data: bytes, basis: int) -> int:
    """jhash_bytes: lookup3 over little-endian words. Unlike lookup3's hashlittle, whole 12-byte blocks
    are all mixed (`n >= 12`) and only a non-empty remainder, zero-padded, goes through the final step,
    so the two differ for lengths that are multiples of 12."""
    n = len(data)
    a = b = c = (0xDEADBEEF + n + basis) & M32
    pos = 0
    while n - pos >= 12:
        a = (a + int.from_bytes(data[pos:pos + 4], "little")) & M32
        b = (b + int.from_bytes(data[pos + 4:pos + 8], "little")) & M32
        c = (c + int.from_bytes(data[pos + 8:pos + 12], "little")) & M32
        a, b, c = _jhash_mix(a, b, c)
        pos += 12
    if pos < n:
        tail = data[pos:].ljust(12, b"\0")
        a = (a + int.from_bytes(tail[0:4], "little")) & M32
        b = (b + int.from_bytes(tail[4:8], "little")) & M32
        c = (c + int.from_bytes(tail[8:12], "little")) & M32
        c = _jhash_final(a, b, c)
    return c


# -- lib/flow.c ---------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1 << 16)
def _address(addr: Address) -> bytes:
    """An address as struct flow stores it: 4 (IPv4) or 16 (IPv6) bytes in network order. An int is an
    IPv4 address. Cached: a simulator asks about the same hosts' addresses again and again."""
    if isinstance(addr, int):
        return addr.to_bytes(4, "big")
    if isinstance(addr, str):
        addr = ipaddress.ip_address(addr)
    return addr.packed


def _mac(mac: str) -> bytes:
    raw = bytes.fromhex(mac.replace(":", ""))
    if len(raw) != 6:
        raise ValueError(f"not a MAC address: {mac!r}")
    return raw


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def _addresses(ip_src: Address, ip_dst: Address) -> tuple[bytes, bytes, int]:
    """Both addresses and the Ethertype (dl_type) of a packet carrying them."""
    src, dst = _address(ip_src), _address(ip_dst)
    if len(src) != len(dst):
        raise ValueError(f"{ip_src} and {ip_dst} are not of one IP version")
    return src, dst, ETH_TYPE_IP if len(src) == 4 else ETH_TYPE_IPV6


def flow_hash_symmetric_l3l4(
    ip_src: Address, ip_dst: Address, proto: int, sport: int, dport: int, basis: int, inc_udp_ports: bool
) -> int:
    """flow_hash_symmetric_l3l4: the basis, src ^ dst (one word for IPv4; two hash_add64 of 64-bit
    words for IPv6), the protocol, and for TCP, SCTP (and UDP with `inc_udp_ports`) sport ^ dport as
    the 16-bit field reads on the host (byte-swapped), finished with the basis again."""
    src, dst, _ = _addresses(ip_src, ip_dst)
    h = basis
    if len(src) == 4:
        h = hash_add(h, int.from_bytes(src, "little") ^ int.from_bytes(dst, "little"))
    else:
        for i in (0, 8):
            h = hash_add64(h, int.from_bytes(src[i:i + 8], "little") ^ int.from_bytes(dst[i:i + 8], "little"))
    h = hash_add(h, proto)
    if proto in (IPPROTO_TCP, IPPROTO_SCTP) or (inc_udp_ports and proto == IPPROTO_UDP):
        h = hash_add(h, int.from_bytes(((sport ^ dport) & 0xFFFF).to_bytes(2, "big"), "little"))
    return hash_finish(h, basis)


def flow_hash_symmetric_l4(
    ip_src: Address, ip_dst: Address, proto: int, sport: int, dport: int, basis: int, eth_src: str, eth_dst: str
) -> int:
    """flow_hash_symmetric_l4: jhash_bytes over a zeroed 32-byte struct: address xor (16 bytes, IPv4 in
    the first 4), eth_type, vlan_tci (0: untagged), TCP/SCTP sport ^ dport (never UDP), eth_src ^
    eth_dst, ip_proto, 3 bytes of padding."""
    src, dst, eth_type = _addresses(ip_src, ip_dst)
    ports = (sport ^ dport) & 0xFFFF if proto in (IPPROTO_TCP, IPPROTO_SCTP) else 0
    fields = b"".join((
        _xor(src, dst).ljust(16, b"\0"),
        eth_type.to_bytes(2, "big"),
        bytes(2),
        ports.to_bytes(2, "big"),
        _xor(_mac(eth_src), _mac(eth_dst)),
        bytes((proto,)),
        bytes(3),
    ))
    return jhash_bytes(fields, basis)


def flow_hash_symmetric_l3(ip_src: Address, ip_dst: Address, basis: int) -> int:
    """flow_hash_symmetric_l3: jhash_bytes over a zeroed 20-byte struct: address xor (16 bytes),
    eth_type, 2 bytes of padding."""
    src, dst, eth_type = _addresses(ip_src, ip_dst)
    return jhash_bytes(_xor(src, dst).ljust(16, b"\0") + eth_type.to_bytes(2, "big") + bytes(2), basis)


def flow_hash_fields(
    fields: str,
    basis: int,
    ip_src: Address,
    ip_dst: Address,
    proto: int,
    sport: int = 0,
    dport: int = 0,
    eth_src: str = ZERO_MAC,
    eth_dst: str = ZERO_MAC,
) -> int:
    """flow_hash_fields: the 32-bit hash OVS's `fields` take of a packet, seeded with the 16-bit basis."""
    if fields == "symmetric_l3l4+udp":
        return flow_hash_symmetric_l3l4(ip_src, ip_dst, proto, sport, dport, basis, True)
    if fields == "symmetric_l3l4":
        return flow_hash_symmetric_l3l4(ip_src, ip_dst, proto, sport, dport, basis, False)
    if fields == "symmetric_l4":
        return flow_hash_symmetric_l4(ip_src, ip_dst, proto, sport, dport, basis, eth_src, eth_dst)
    if fields == "symmetric_l3":
        return flow_hash_symmetric_l3(ip_src, ip_dst, basis)
    if fields == "nw_src":
        return jhash_bytes(_address(ip_src), basis)
    if fields == "nw_dst":
        return jhash_bytes(_address(ip_dst), basis)
    if fields == "eth_src":
        return jhash_bytes(_mac(eth_src), basis)
    raise ValueError(f"unknown multipath fields {fields!r}; expected one of: {', '.join(FIELDS)}")


# -- lib/multipath.c ----------------------------------------------------------------------------------
def _hrw(h: int, n_links: int) -> int:
    """algorithm_hrw: the link with the highest hash_2words(hash, link); the first of equals wins."""
    best_link, best_weight = 0, hash_2words(h, 0)
    for link in range(1, n_links):
        weight = hash_2words(h, link)
        if weight > best_weight:
            best_link, best_weight = link, weight
    return best_link


def _iter_hash(h: int, n_links: int, modulo: int) -> int:
    """algorithm_iter_hash: hash_2words(hash, i) % modulo for i = 0, 1, ... until below n_links. A
    modulo outside [n_links, 2 * n_links] becomes n_links rounded up to a power of two (round_up_pow2);
    the remainder is stored in a uint16_t before the comparison, so it wraps at 2**16."""
    if modulo < n_links or modulo // 2 > n_links:
        modulo = 1 << (n_links - 1).bit_length()
    i = 0
    while True:
        link = (hash_2words(h, i) % modulo) & 0xFFFF
        if link < n_links:
            return link
        i += 1


def multipath_algorithm(h: int, algorithm: str, n_links: int, arg: int = 0) -> int:
    """multipath_algorithm: the link (0 .. n_links - 1) a 32-bit flow hash selects."""
    if algorithm == "hrw":
        return _hrw(h, n_links) if n_links <= HRW_MAX_LINKS else _iter_hash(h, n_links, 0)
    if algorithm == "modulo_n":
        return h % n_links
    if algorithm == "hash_threshold":
        # UINT32_MAX / n_links + 1 wraps to 0 for one link; OVS answers 0 before dividing.
        return 0 if n_links == 1 else h // (M32 // n_links + 1)
    if algorithm == "iter_hash":
        return _iter_hash(h, n_links, arg)
    raise ValueError(f"unknown multipath algorithm {algorithm!r}; expected one of: {', '.join(ALGORITHMS)}")


def multipath_link(
    ip_src: Address,
    ip_dst: Address,
    proto: int,
    sport: int,
    dport: int,
    basis: int,
    n_links: int,
    algorithm: str = "hrw",
    *,
    fields: str = "symmetric_l3l4+udp",
    arg: int = 0,
    eth_src: str = ZERO_MAC,
    eth_dst: str = ZERO_MAC,
) -> int:
    """The link (0 .. n_links - 1) `multipath(fields, basis, algorithm, n_links, arg, dst)` writes for a
    packet, as multipath_execute does. The value fits any destination OVS accepts for n_links (its
    parser refuses a field with fewer than n_links values). MACs matter only to eth_src and symmetric_l4;
    ports only to TCP, SCTP and UDP."""
    if not 0 <= basis <= 0xFFFF:
        raise ValueError(f"basis {basis} is not a 16-bit value")
    if not 1 <= n_links <= MAX_LINKS:
        raise ValueError(f"n_links {n_links} is not in 1 .. {MAX_LINKS}")
    if not (0 <= sport <= 0xFFFF and 0 <= dport <= 0xFFFF and 0 <= proto <= 0xFF and 0 <= arg <= M32):
        raise ValueError(f"port, protocol or arg out of range: {sport}, {dport}, {proto}, {arg}")
    h = flow_hash_fields(fields, basis, ip_src, ip_dst, proto, sport, dport, eth_src, eth_dst)
    return multipath_algorithm(h, algorithm, n_links, arg)
