"""Arrivals of one run: every request's time, tenant, class and lengths, drawn up front from a seed.

Each stream is a non-homogeneous Poisson process with rate ``rate_per_s x load(t) x stream
spikes(t)``, drawn by thinning (Lewis & Shedler, 1979): candidates at the peak rate, each kept with
probability ``rate(t) / peak``. Lengths are drawn per request (:class:`~.scenario.Lengths`); the
output is clipped to the declared ``max_tokens`` and to the model context, so a request always
fits the replica model.

Drawing everything before the run keeps the traffic identical across policies for one seed:
policies are compared on the same requests (common random numbers).
"""

import dataclasses

import numpy as np

from tidegate.sim.simulate.scenario import Scenario, Stream


@dataclasses.dataclass(frozen=True)
class Arrivals:
    """Columns of equal length ``n``, sorted by ``time_s``: ``stream`` indexes ``scenario.streams``."""

    time_s: np.ndarray  # float64 seconds
    stream: np.ndarray  # int
    prompt_tokens: np.ndarray  # int
    output_tokens: np.ndarray  # int, what the model will generate
    max_tokens: np.ndarray  # int, what the client declares (admission reserves this)

    def __len__(self) -> int:
        return len(self.time_s)


def rate_multiplier(scenario: Scenario, stream: Stream, t: np.ndarray) -> np.ndarray:
    """The load multiplier of ``stream`` at times ``t`` (seconds), >= 0."""
    m = np.ones_like(t)
    if scenario.diurnal is not None:
        m = m * scenario.diurnal.multiplier(t)
    for spike in (*scenario.spikes, *stream.spikes):
        m = m * spike.multiplier(t)
    return m


def _peak(scenario: Scenario, stream: Stream) -> float:
    grid = np.linspace(0.0, scenario.duration_s, 4097)
    return float(rate_multiplier(scenario, stream, grid).max()) * stream.rate_per_s * 1.01


def generate(scenario: Scenario, seed: int) -> Arrivals:
    """All arrivals in ``[0, duration_s)`` for ``seed`` (same seed, same arrivals)."""
    rng = np.random.default_rng(seed)
    context = min(scenario.model.max_context_tokens, scenario.replica.max_model_len or 1 << 30)
    cols: list[tuple[np.ndarray, ...]] = []
    for index, stream in enumerate(scenario.streams):
        peak = _peak(scenario, stream)
        n = rng.poisson(peak * scenario.duration_s)
        t = np.sort(rng.uniform(0.0, scenario.duration_s, n))
        keep = rng.uniform(0.0, peak, n) < stream.rate_per_s * rate_multiplier(scenario, stream, t)
        t = t[keep]
        k = len(t)
        prompt = np.minimum(stream.prompt.sample(rng, k), context - 1)
        max_tokens = np.minimum(stream.max_tokens, context - prompt)
        output = np.clip(stream.output.sample(rng, k), 1, max_tokens)
        cols.append((t, np.full(k, index), prompt, output, max_tokens))
    time_s, stream_ix, prompt, output, max_tokens = (np.concatenate(c) for c in zip(*cols, strict=True))
    order = np.argsort(time_s, kind="stable")
    return Arrivals(time_s[order], stream_ix[order], prompt[order], output[order], max_tokens[order])
