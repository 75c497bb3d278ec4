"""Pure descriptions of fabrics: the data model, builders, specs and files, validation, equal-cost paths.

Nothing here needs Mininet or root. Typical use::

    topo = parse_spec("leaf-spine:spines=4,leaves=4,hosts=2,rate=20")
    next_hops(topo, "leaf1", "h8")   # the uplinks an ECMP group on leaf1 spreads over
    fat_tree(k=4).tiers()            # {"core": [...], "agg": [...], "edge": [...]}
"""

from topologies.builders import assign_addresses, clos, fat_tree, in_server, leaf_spine
from topologies.model import DEFAULT_MTU, ROLE_TIER, Link, Node, Topology
from topologies.paths import (
    distances,
    equal_cost_paths,
    link_at,
    next_hops,
    nodes_on_paths,
    path_count,
    routing_table,
    shortest_path_length,
    spines_on_paths,
)
from topologies.spec import DEFAULT_SPEC, dump, load, load_json, parse_spec
from topologies.validate import SpecError, validate

__all__ = [
    "DEFAULT_MTU",
    "DEFAULT_SPEC",
    "ROLE_TIER",
    "Link",
    "Node",
    "SpecError",
    "Topology",
    "assign_addresses",
    "clos",
    "distances",
    "dump",
    "equal_cost_paths",
    "fat_tree",
    "in_server",
    "leaf_spine",
    "link_at",
    "load",
    "load_json",
    "next_hops",
    "nodes_on_paths",
    "parse_spec",
    "path_count",
    "routing_table",
    "shortest_path_length",
    "spines_on_paths",
    "validate",
]
