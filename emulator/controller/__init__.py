"""fabriclab's OpenFlow 1.3 controller: proactive ECMP / spray / single-path rules, proxy ARP, port
counters and a JSON HTTP API. Run it with `python -m emulator.controller`; `rules` is the pure part."""
