"""The live view: watch a running fabric and switch ECMP <-> spraying while traffic runs.

`fabriclab live` (commands.py) brings a fabric up, starts a continuous workload in its hosts
(workload.py) and serves a dashboard (server.py, static/) or a terminal view (tui.py). Both read one
`session.LiveSession`, which talks to the fabric through the small `backend.Backend` interface:
`backend.FabricBackend` is the real fabric (Mininet, Open vSwitch, the controller's JSON API and the
transport's endpoints), `backend.FakeBackend` an in-memory stand-in with synthetic counters for tests
and for trying the view without root. `state`, `layout` and `controls` are pure: counters in, numbers
and drawings out; requests in, checked controls out. `bench` measures the view itself.
"""
