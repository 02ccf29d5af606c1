"""Model time for a replica driven live: a wall clock run through a time scale, a slowdown and a stall.

``model_now = model_anchor + (wall_now - wall_anchor) * rate`` with
``rate = time_scale / slowdown`` (0 while stalled). Changing the rate re-anchors first, so model
time is continuous and never goes back; a stall freezes it and a resume continues from where it
stopped (the stalled interval is not caught up). ``time_scale = 10`` makes the simulated replica
behave like a GPU ten times as fast, so tests run ten times faster than real time; everything an
outside observer measures (token gaps, TTFT, the ``/metrics`` histograms) is in wall seconds.

Pure: the wall clock is injected (``time.monotonic`` in the server, a fake in tests).
"""

import math
from collections.abc import Callable


class ScaledClock:
    """Model seconds from wall seconds at a piecewise-constant rate.

    Raises ``ValueError`` for a time scale or slowdown that is not a positive finite number.
    """

    def __init__(self, wall: Callable[[], float], time_scale: float = 1.0) -> None:
        if not (math.isfinite(time_scale) and time_scale > 0):
            raise ValueError("time_scale must be a positive number")
        self._wall = wall
        self.time_scale = time_scale
        self._slowdown = 1.0
        self._stalled = False
        self._wall_anchor = wall()
        self._model_anchor = 0.0

    @property
    def rate(self) -> float:
        """Model seconds per wall second now (0 while stalled)."""
        return 0.0 if self._stalled else self.time_scale / self._slowdown

    def now(self) -> float:
        """Current model time (seconds since the clock was made, excluding stalls)."""
        return self._model_anchor + (self._wall() - self._wall_anchor) * self.rate

    def set_pace(self, *, slowdown: float, stalled: bool) -> None:
        """Change the slowdown factor (>0; 3 = three times slower) and the stall switch from now on."""
        if not (math.isfinite(slowdown) and slowdown > 0):
            raise ValueError("slowdown must be a positive number")
        self._model_anchor = self.now()
        self._wall_anchor = self._wall()
        self._slowdown = slowdown
        self._stalled = stalled

    def wall_delay(self, model_time_s: float) -> float | None:
        """Wall seconds until model time reaches ``model_time_s`` (0 if passed; ``None`` while stalled)."""
        rate = self.rate
        if rate == 0:
            return None
        return max(0.0, (model_time_s - self.now()) / rate)
