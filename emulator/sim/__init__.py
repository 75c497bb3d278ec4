"""The simulated engine's fabric: a Topology on a virtual clock, forwarded by the controller's own rules."""
