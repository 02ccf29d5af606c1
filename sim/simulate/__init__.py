"""``tidegate simulate``: a discrete-event policy simulator of one InferencePool in virtual time.

Pure core first:

- :mod:`.scenario` -- scenario YAML (traffic, cluster timings, pool spec, faults); built-ins in ``scenarios/``;
- :mod:`.workload` -- arrivals and lengths drawn from a seed;
- :mod:`.cluster` -- pods: cold start, warm pool (the operator's planner), loss, GPU-seconds;
- :mod:`.hpa` -- the HPA algorithm (tolerance, stabilisation, rate limits);
- :mod:`.core` -- the event loop and request accounting (conservation);
- :mod:`.baselines`, :mod:`.tidegate_policy`, :mod:`.policies` -- what decides admission and scale;
- :mod:`.report` -- tables; :mod:`.plots` -- PNGs (matplotlib, optional extra ``sim``);
- :mod:`.matrix` -- every scenario x policy; :mod:`.cli` -- the subcommand.
"""
