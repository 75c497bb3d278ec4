"""Pure numbers behind the experiments, one module per concern: `placement` (flows, fair shares, the
ideal), `hashing` (balls in bins: ECMP's expectation), `links` (link counters, imbalance, hot links),
`fidelity` (did the emulator keep up), `recovery_time` (goodput back after a fault) and `framing`
(wire bytes, ideal FCT, slowdown). Nothing here needs root or a running fabric: the runner feeds them
topologies and counters, the tests hand-made ones."""
