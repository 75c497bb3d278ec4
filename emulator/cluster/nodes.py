"""Mininet's cluster nodes and links (mininet/examples/cluster.py), told which ssh configuration to use.

Mininet's engine runs `ssh` itself: a shell per remote node, commands on a server's root namespace,
and `ssh -w` for each server-crossing link. With namespace servers those ssh calls must use the run's
own key and known hosts, and nothing may be written into the user's ~/.ssh: each class here puts
`-F <run's ssh config>` into every ssh command line it starts. With real servers no config is given
and ssh reads the user's own, as Mininet expects.
"""

from __future__ import annotations

from typing import Any

from mininet.examples.cluster import RemoteHost, RemoteLink, RemoteOVSSwitch


def _with_config(cmd: Any, config: str | None) -> Any:
    """`cmd` with `-F config` after its leading `ssh`, if it starts with one."""
    if not config:
        return cmd
    if isinstance(cmd, str):
        cmd = cmd.split()
    cmd = list(cmd)
    if cmd and cmd[0] == "ssh":
        return ["ssh", "-F", config, *cmd[1:]]
    return cmd


class _SshConfigured:
    """Mixed in before Mininet's RemoteMixin: `ssh_config` joins its ssh base command and the ssh that
    `RemoteLink.makeTunnel` runs through `rpopen`."""

    ssh_config: str | None = None

    def __init__(self, name: str, *args: Any, ssh_config: str | None = None, **kwargs: Any) -> None:
        self.ssh_config = ssh_config
        if ssh_config:
            # RemoteMixin.__init__ builds its ssh command from the instance's sshbase.
            self.sshbase = ["ssh", "-F", ssh_config, *RemoteOVSSwitch.sshbase[1:]]
        super().__init__(name, *args, **kwargs)

    def rpopen(self, *cmd: Any, **opts: Any) -> Any:
        if len(cmd) == 1:
            cmd = (_with_config(cmd[0], self.ssh_config),)
        return super().rpopen(*cmd, **opts)  # type: ignore[misc]


class ClusterHost(_SshConfigured, RemoteHost):
    """An emulated host on a (possibly remote) server."""


class ClusterOVSSwitch(_SshConfigured, RemoteOVSSwitch):
    """A switch in the Open vSwitch of its server."""


class ClusterLink(RemoteLink):
    """A veth pair within a server, an ssh tunnel (tap devices at both ends) across servers."""

    def tunnel_pid(self) -> int | None:
        return self.tunnel.pid if getattr(self, "tunnel", None) not in (None, 1) else None
