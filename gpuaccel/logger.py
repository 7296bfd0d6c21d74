"""gpuaccel.LossLogger: loss and metric logging that never makes the host
wait for the GPU.

The training loop calls ``log.log(loss=loss)`` every step instead of
``loss.item()``.  A CUDA value is read on the GPU by a tiny kernel queued on
the stream that produced it (torch's current stream); every `every` steps
the window's values travel to pinned host memory by an async copy, and they
reach ``on_log`` (and ``progress``, ``latest()``, ``history()``) a few steps
later, once that copy has completed.  The native part is csrc/logger.c.
"""

import math

import numpy as np

from . import _C

__all__ = ["LossLogger", "NonFiniteError"]

# window stats layout (see kernels.h)
_SUM, _COUNT, _NONFINITE, _MAX, _NEG_MIN, _NEG_FIRST_BAD = range(6)


class NonFiniteError(FloatingPointError):
    """A logged metric was NaN or infinite (raise_on_nonfinite=True)."""


def _nonfinite_mean(values):
    """The mean torch.mean would give a window holding non-finite values:
    inf/-inf for infinities of one sign (and no NaN), else NaN.  `values` are
    this rank's; when all of them are finite the non-finite ones came from
    another rank, whose signs are not known here: NaN."""
    bad = values[~np.isfinite(values)]
    if len(bad) and not np.isnan(bad).any() and (bad > 0).all() == (bad > 0).any():
        return math.inf if bad[0] > 0 else -math.inf
    return math.nan


class LossLogger(_C._LoggerCore):
    """Logs named scalars every step without synchronizing with the GPU.

    ``on_log(step, values)`` is called once per window of `every` steps, with
    `step` the window's last step (steps count log() calls from 1) and
    ``values[name]`` the window's mean.  `progress` may be a tqdm bar: its
    postfix shows the newest means.  ``reduce="mean"`` averages windows over
    the ranks of torch.distributed (all-reduced asynchronously, on the
    training stream for CUDA values).

    Non-finite values are never dropped silently: a window holding a NaN or
    an infinity has a non-finite mean, as torch.mean would give it (inf or
    -inf when its non-finite values are infinities of one sign, NaN
    otherwise; NaN when they came from another rank), and summary() counts
    them ("nonfinite") beside the mean of the finite values
    ("finite_mean").  ``nonfinite_step``/``nonfinite_metric`` name the first
    one.  With ``raise_on_nonfinite=True`` the first log(), flush() or
    close() after it arrived raises NonFiniteError.
    """

    def __init__(self, every=50, *, on_log=None, progress=None, reduce=None, raise_on_nonfinite=False,
                 capacity=65536, stream=None, max_metrics=16):
        for name, value in (("every", every), ("capacity", capacity), ("max_metrics", max_metrics)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError("LossLogger: %s must be a positive int, got %r" % (name, value))
        if capacity < every:
            raise ValueError("LossLogger: capacity (%d) must be at least every (%d)" % (capacity, every))
        if on_log is not None and not callable(on_log):
            raise TypeError("LossLogger: on_log must be callable(step, values) or None, got %r" % (on_log,))
        if progress is not None and not hasattr(progress, "set_postfix"):
            raise TypeError("LossLogger: progress must be a tqdm bar (with set_postfix) or None, got %s"
                            % type(progress).__name__)
        if reduce not in (None, "mean"):
            raise ValueError("LossLogger: reduce must be None or 'mean', got %r" % (reduce,))
        self._dist = None
        if reduce == "mean":
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()):
                raise RuntimeError("LossLogger(reduce='mean') needs torch.distributed to be initialized "
                                   "(torch.distributed.init_process_group)")
            self._dist = dist
        super().__init__(every, capacity, max_metrics, stream, reduce == "mean")
        self.on_log = on_log
        self.progress = progress
        self.raise_on_nonfinite = bool(raise_on_nonfinite)
        self.nonfinite_step = None
        self.nonfinite_metric = None
        self._latest, self._latest_step = {}, None
        self._history = {}  # name -> [(steps, values), ...]
        self._totals = {}   # name -> [sum, count, nonfinite, max, min]

    # ------------------------------------------------- called by the core

    def _deliver(self, window):
        means = {}
        for name, (stats, steps, values) in window["metrics"].items():
            if stats is None:  # steps replayed by a CUDA graph: stats from the values
                finite = values[np.isfinite(values)]
                bad = steps[~np.isfinite(values)]
                stats = (finite.sum(), float(len(finite)), float(len(bad)),
                         finite.max() if len(finite) else -math.inf, -finite.min() if len(finite) else -math.inf,
                         -float(bad[0]) if len(bad) else -math.inf)
            self._history.setdefault(name, []).append((steps, values))
            count = stats[_COUNT]
            means[name] = stats[_SUM] / count if count else math.nan
            if stats[_NONFINITE]:
                means[name] = _nonfinite_mean(values)
            total = self._totals.setdefault(name, [0.0, 0.0, 0.0, -math.inf, math.inf])
            total[0] += stats[_SUM]
            total[1] += count
            total[2] += stats[_NONFINITE]
            total[3] = max(total[3], stats[_MAX])
            total[4] = min(total[4], -stats[_NEG_MIN])
            if stats[_NEG_FIRST_BAD] > -math.inf:
                step = int(-stats[_NEG_FIRST_BAD])
                if self.nonfinite_step is None or step < self.nonfinite_step:
                    self.nonfinite_step, self.nonfinite_metric = step, name
                    if self.raise_on_nonfinite:
                        local = values[steps == step]
                        what = ("%r" % float(local[0])) if len(local) else "non-finite"
                        self._set_error(NonFiniteError("LossLogger: metric '%s' was %s at step %d"
                                                       % (name, what, step)))
        if not means:
            return
        self._latest, self._latest_step = means, window["end"]
        if self.progress is not None:
            self.progress.set_postfix({k: "%.4g" % v for k, v in means.items()}, refresh=False)
        if self.on_log is not None:
            self.on_log(window["end"], dict(means))

    def _reduce_host(self, stats):
        import torch

        t = torch.from_numpy(stats)
        sums, maxima = t[:, :3].contiguous(), t[:, 3:].contiguous()
        works = (self._dist.all_reduce(sums, op=self._dist.ReduceOp.SUM, async_op=True),
                 self._dist.all_reduce(maxima, op=self._dist.ReduceOp.MAX, async_op=True))
        return works, t, sums, maxima

    def _reduce_device(self, stats):
        import torch

        t = torch.from_dlpack(stats)
        sums, maxima = t[:, :3].contiguous(), t[:, 3:].contiguous()
        for part, op in ((sums, self._dist.ReduceOp.SUM), (maxima, self._dist.ReduceOp.MAX)):
            self._dist.all_reduce(part, op=op, async_op=True).wait()  # a stream wait, not a host wait
        t[:, :3].copy_(sums)
        t[:, 3:].copy_(maxima)
        return ()  # complete as far as the host is concerned: the copy follows on the stream

    def _reduce_done(self, handle):
        if not handle:
            return True
        works, t, sums, maxima = handle
        if not all(w.is_completed() for w in works):
            return False
        t[:, :3] = sums
        t[:, 3:] = maxima
        return True

    # --------------------------------------------------------------- API

    def latest(self):
        """The newest window means that have arrived ({} before the first)."""
        return dict(self._latest)

    @property
    def latest_step(self):
        return self._latest_step

    def history(self, name, *, with_steps=False):
        """Every per-step value of `name` that has arrived, as a float64 array
        (with with_steps=True: (steps, values))."""
        if name not in self._history:
            known = ", ".join(repr(n) for n in self.metric_names) or "none yet"
            raise KeyError("LossLogger.history: no values of %r have arrived (metrics: %s)" % (name, known))
        parts = self._history[name]
        steps = np.concatenate([p[0] for p in parts])
        values = np.concatenate([p[1] for p in parts])
        if len(parts) > 1:
            self._history[name] = [(steps, values)]
        return (steps, values) if with_steps else values

    def summary(self):
        """Per metric: mean, min, max, count and non-finite count of every
        value that has arrived, and the last window's mean."""
        out = {}
        for name, (s, count, bad, high, low) in self._totals.items():
            finite_mean = s / count if count else math.nan
            out[name] = {"mean": math.nan if bad else finite_mean, "finite_mean": finite_mean,
                         "min": low if count else math.nan, "max": high if count else math.nan,
                         "count": int(count + bad), "nonfinite": int(bad), "last": self._latest.get(name, math.nan)}
        return out

    def flush(self):
        """Waits for every value logged so far (closing the partial window),
        fires the remaining callbacks, and returns summary().  Raises
        NonFiniteError (raise_on_nonfinite=True) when a value that arrived
        was not finite and no log() has raised it yet."""
        self._flush_core()
        error = self._take_error()
        if error is not None:
            raise error
        return self.summary()

    def close(self):
        if not getattr(self, "_closed", False):
            self._closed = True
            try:
                self.flush()
            finally:
                self._close_core()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return "LossLogger(every=%d, step=%d, metrics=%s, pending=%d)" % (
            self.every, self.step, self.metric_names, self.pending_windows)
