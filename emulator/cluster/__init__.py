"""Fabrics split across servers, on Mininet's own cluster engine (mininet/examples/cluster.py).

- nsservers: servers made of network and mount namespaces, each with its own sshd and Open vSwitch,
  so a cluster can be built and tested on one machine;
- placement: which server each node runs on (a leaf or edge switch with its hosts);
- nodes: Mininet's remote host, switch and ssh-tunnel link, using the run's ssh configuration;
- fabric: ClusterFabric, a Fabric whose nodes run on several servers;
- selftest: `fabriclab cluster selftest`.

`new_fabric` is what commands use to bring a fabric up: a ClusterFabric when --servers (or
FABRICLAB_SERVERS, or a fabric file's `servers:` key) names servers, the one-machine Fabric otherwise.
"""

from __future__ import annotations

import os
from typing import Any

from topologies.model import Topology

# Every fabric a process brings up goes across these servers ('ns:N' or 'host,host,...').
SERVERS_ENV = "FABRICLAB_SERVERS"


def new_fabric(topo: Topology, mode: str = "ecmp", isolation: str | None = None, **kwargs: Any) -> Any:
    from emulator.network import Fabric

    # --servers (which sets the variable) wins over a fabric file's `servers:`.
    servers = os.environ.get(SERVERS_ENV, "").strip() or str(topo.params.get("run_on_servers", "")).strip()
    if not servers:
        return Fabric(topo, mode=mode, isolation=isolation, **kwargs)
    from emulator.cluster.fabric import ClusterFabric, parse_servers

    return ClusterFabric(topo, mode=mode, isolation=isolation, servers=parse_servers(servers), **kwargs)
