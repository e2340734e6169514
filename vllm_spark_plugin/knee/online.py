"""Online knee estimator: per-step samples in a ring buffer, refitted with exponential forgetting.

Hot path (`observe`, once per engine step): pure Python, no numpy, no lock.  It writes one slot of
five preallocated `array('d')` buffers (raw doubles: no Python objects are kept alive per sample)
and then advances a sample counter.  Memory is 5 x 8 bytes x window (plus 2 x 8 bytes x
ttft_window for first tokens), fixed at construction.

Reader side (`estimate`, from a scrape thread): a sequence-lock style snapshot without blocking
the writer.  It reads the counter (c0), copies the buffers, reads the counter again (c1), and keeps
only samples numbered in [c1 - window + 1, c0): those were complete before the copy began and
could not have been overwritten while it ran.  If the writer lapped the whole ring during the copy
the snapshot is retried.  This relies on the writer's stores landing in program order (slot, then
counter), which CPython guarantees under the GIL; were a sample ever torn anyway, it is one
outlier among thousands and the robust fit gives it no weight.  Readers serialise among
themselves with a lock that `observe` never touches.

TTFT side (`observe_ttft`, once per first token): the same kind of ring, (batch, TTFT) pairs, from
which `ttft_capacity()` derives the highest batch whose median TTFT meets the TTFT SLO
(`slo_capacity.py` gives the method and its verdicts).
"""
from __future__ import annotations

import math
import threading
import time
from array import array
from typing import Callable, Iterable

import numpy as np

from vllm_spark_plugin.settings import Settings

from .fit import MIN_STEP_SAMPLES, fit_steps
from .result import KneeResult, finite_or_none
from .slo_capacity import TtftCapacity, ttft_capacity

_INF = math.inf
_DEFAULTS = Settings()  # the settings owner's defaults, for estimators built without settings


def _coerce_floors(floors) -> tuple[float, ...]:
    """Floors as a tuple of floats; also accepts the comma-separated form of SPARK_PLUGIN_FLOORS."""
    if isinstance(floors, str):
        floors = [f for f in floors.split(",") if f.strip()]
    out = []
    for f in floors:
        try:
            out.append(float(f))
        except (TypeError, ValueError):
            raise ValueError(f"floors must be numbers of tok/s, got {f!r}") from None
    return tuple(out)


class OnlineKneeEstimator:
    """Fit t = alpha + beta*batch + gamma*prefill to the last `window` engine steps.

    Samples are weighted by 0.5 ** (age / halflife_seconds), so after a workload or configuration
    change the estimate follows the new steps within about one half-life.  `estimate()` refits at
    most every `refit_seconds` and returns the cached result in between.
    """

    def __init__(self, window: int = _DEFAULTS.knee_window, halflife_seconds: float = _DEFAULTS.knee_halflife_seconds,
                 refit_seconds: float = _DEFAULTS.knee_refit_seconds, floors: Iterable[float] = _DEFAULTS.floors,
                 clock: Callable[[], float] = time.monotonic,
                 *, bootstrap: int = 0, seed: int = 0, min_samples: int = MIN_STEP_SAMPLES,
                 ttft_slo_seconds: float | None = None, ttft_window: int = 1024) -> None:
        if not (isinstance(window, int) and window >= 2):
            raise ValueError(f"window must be an integer >= 2, got {window!r}")
        hl = finite_or_none(halflife_seconds)
        if hl is None or hl <= 0:
            raise ValueError(f"halflife_seconds must be a positive finite number, got {halflife_seconds!r}")
        rs = finite_or_none(refit_seconds)
        if rs is None or rs < 0:
            raise ValueError(f"refit_seconds must be a finite number >= 0, got {refit_seconds!r}")
        self.window = window
        self.halflife_seconds = hl
        self.refit_seconds = rs
        self.floors = _coerce_floors(floors)
        self.bootstrap = int(bootstrap)
        self.seed = int(seed)
        self.min_samples = int(min_samples)
        self._clock = clock
        zeros = bytes(8 * window)
        self._b = array("d", zeros)
        self._p = array("d", zeros)
        self._t = array("d", zeros)
        self._k = array("d", zeros)
        self._ts = array("d", zeros)
        self._count = 0          # samples accepted so far; advanced after the slot is written
        self.invalid = 0         # samples rejected by observe (non-finite, <= 0 time, batch < 1, ...)
        slo = finite_or_none(ttft_slo_seconds)
        if ttft_slo_seconds is not None and (slo is None or slo <= 0):
            raise ValueError(f"ttft_slo_seconds must be a positive finite number, got {ttft_slo_seconds!r}")
        if not (isinstance(ttft_window, int) and ttft_window >= 2):
            raise ValueError(f"ttft_window must be an integer >= 2, got {ttft_window!r}")
        self.ttft_slo_seconds = slo
        self.ttft_window = ttft_window
        tz = bytes(8 * ttft_window)
        self._tb = array("d", tz)
        self._tt = array("d", tz)
        self._ttft_count = 0
        self._fit_lock = threading.Lock()
        self._cached: KneeResult | None = None
        self._cached_at: float | None = None
        self._cached_count = -1

    @classmethod
    def from_settings(cls, settings, clock: Callable[[], float] = time.monotonic, **kwargs) -> "OnlineKneeEstimator":
        """Build from validated settings (`vllm_spark_plugin.settings.Settings`: SPARK_PLUGIN_KNEE_*,
        SPARK_PLUGIN_FLOORS, SPARK_PLUGIN_TTFT_SLO_SECONDS)."""
        kwargs.setdefault("ttft_slo_seconds", settings.ttft_slo_seconds)
        return cls(window=settings.knee_window, halflife_seconds=settings.knee_halflife_seconds,
                   refit_seconds=settings.knee_refit_seconds, floors=settings.floors, clock=clock, **kwargs)

    # ------------------------------------------------------------------ hot path

    def observe(self, batch: int, prefill_tokens: int, step_seconds: float,
                tokens_per_stream: float = 1.0) -> None:
        """Record one engine step: running streams, prefill tokens in it, wall seconds, tokens/stream.

        O(1), no numpy, never raises: an invalid sample is counted in `invalid` and dropped.
        """
        try:
            if (1 <= batch < _INF and 0 <= prefill_tokens < _INF and 0.0 < step_seconds < _INF
                    and 0.0 < tokens_per_stream < _INF):
                i = self._count % self.window
                self._b[i] = batch
                self._p[i] = prefill_tokens
                self._t[i] = step_seconds
                self._k[i] = tokens_per_stream
                self._ts[i] = self._clock()
                self._count += 1  # publish: the reader trusts only slots below this count
                return
        except (TypeError, ValueError, OverflowError):
            pass
        self.invalid += 1

    def observe_ttft(self, batch: int, ttft_seconds: float) -> None:
        """Record one first token: the batch of the step that produced it and the request's TTFT.

        O(1), never raises; invalid pairs are dropped."""
        try:
            if 1 <= batch < _INF and 0.0 <= ttft_seconds < _INF:
                i = self._ttft_count % self.ttft_window
                self._tb[i] = batch
                self._tt[i] = ttft_seconds
                self._ttft_count += 1
        except (TypeError, ValueError, OverflowError):
            pass

    # ------------------------------------------------------------------ reader side

    @property
    def observed(self) -> int:
        """Valid samples observed since start (including those the ring has since overwritten)."""
        return self._count

    @property
    def samples(self) -> int:
        """Samples currently held in the ring."""
        return min(self._count, self.window)

    def _snapshot(self):
        w = self.window
        for _ in range(8):
            c0 = self._count
            if c0 == 0:
                return None
            cols = [np.frombuffer(a, dtype=np.float64).copy() for a in (self._b, self._p, self._t, self._k, self._ts)]
            c1 = self._count
            lo, hi = max(0, c1 - w + 1), c0
            if hi > lo:
                idx = np.arange(lo, hi) % w
                return [c[idx] for c in cols]
        return None

    def estimate(self, force: bool = False) -> KneeResult | None:
        """The current fit (cached for `refit_seconds`); None before the first valid sample."""
        with self._fit_lock:
            now = self._clock()
            fresh = self._cached_at is not None and now - self._cached_at < self.refit_seconds
            if not force and (fresh or (self._cached_at is not None and self._cached_count == self._count)):
                # Nothing new: forgetting weights scale uniformly with time, so the fit is unchanged
                return self._cached
            count = self._count
            snap = self._snapshot()
            if snap is None:
                self._cached, self._cached_at, self._cached_count = None, now, count
                return None
            b, p, t, k, ts = snap
            # age relative to the newest sample: identical after normalisation, and no underflow
            # to zero weight when serving paused for a long time
            age = np.maximum(ts.max() - ts, 0.0)
            weights = np.maximum(np.exp2(-age / self.halflife_seconds), 1e-300)
            result = fit_steps(b, p, t, weights, k, floors=self.floors, bootstrap=self.bootstrap,
                               seed=self.seed, min_samples=self.min_samples)
            if self.invalid:
                result.notes.append(f"{self.invalid} invalid step sample(s) ignored since start")
            self._cached, self._cached_at, self._cached_count = result, now, count
            return result

    def recent_steps(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The newest `n` samples held, oldest first: (batch, prefill tokens, step seconds)."""
        snap = self._snapshot()
        if snap is None:
            return np.empty(0), np.empty(0), np.empty(0)
        b, p, t = snap[0], snap[1], snap[2]
        return b[-n:], p[-n:], t[-n:]

    def ttft_capacity(self) -> TtftCapacity:
        """Highest batch whose median TTFT meets the TTFT SLO, from the TTFT ring (with its verdict)."""
        w = self.ttft_window
        for _ in range(8):
            c0 = self._ttft_count
            b = np.frombuffer(self._tb, dtype=np.float64).copy()
            t = np.frombuffer(self._tt, dtype=np.float64).copy()
            c1 = self._ttft_count
            lo, hi = max(0, c1 - w + 1), c0
            if hi >= lo:
                idx = np.arange(lo, hi) % w
                return ttft_capacity(b[idx], t[idx], self.ttft_slo_seconds)
        return ttft_capacity((), (), self.ttft_slo_seconds)

    def ratio(self, current_batch: float) -> float | None:
        """current_batch / K from the last estimate (no refit here); None when K is unknown or 0."""
        res = self._cached
        knee = None if res is None else res.knee
        cb = finite_or_none(current_batch)
        if knee is None or not knee > 0 or cb is None or cb < 0:
            return None
        return finite_or_none(cb / knee)
