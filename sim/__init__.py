"""``tidegate sim-backend``: a simulated OpenAI-compatible model server (vLLM-like) for tests, demo and benchmarks.

Layout, pure core first:

- :mod:`tidegate.sim.replica` — the continuous-batching replica model (no I/O, explicit model
  time); reused by the discrete-event simulator;
- :mod:`tidegate.sim.tokenizer` — the deterministic ~4-characters-per-token tokenizer;
- :mod:`tidegate.sim.clock` — model time from a wall clock (time scale, slowdown, stall);
- :mod:`tidegate.sim.faults` — the fault switches and their parsing;
- :mod:`tidegate.sim.metrics` — ``/metrics`` under vLLM's names (one registry per server);
- :mod:`tidegate.sim.protocol` — OpenAI request parsing and response/chunk shapes;
- :mod:`tidegate.sim.server` — the aiohttp server that drives the model in real time;
- :mod:`tidegate.sim.cli` — the ``tidegate sim-backend`` subcommand.
"""
