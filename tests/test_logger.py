"""LossLogger with host values (CPU tensors, Arrays, Python numbers) and the
distributed mean over two gloo processes; GPU values: test_cuda_logger.py."""

import math
import socket
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest

import gpuaccel as ga

from helpers import python_env
from ops import logger_windows_ref

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("every,steps", [(1, 7), (5, 23), (10, 10), (7, 100), (50, 49)])
def test_window_means_and_history_match_numpy(rng, every, steps):
    loss = rng.standard_normal(steps) * 3
    acc = rng.random(steps)
    seen = []
    log = ga.LossLogger(every, on_log=lambda step, v: seen.append((step, dict(v))))
    for i in range(steps):
        log.log(loss=torch.tensor(loss[i], dtype=torch.float32), acc=float(acc[i]),
                lr=ga.asarray(np.array([0.1 * i])))
    complete = steps // every
    assert len(seen) == complete  # host values: whole windows arrive at once
    summary = log.flush()
    ref_loss = logger_windows_ref(loss.astype(np.float32), every)
    assert [s for s, _ in seen] == [s for s, _ in ref_loss]
    for (_, values), (_, want) in zip(seen, ref_loss):
        assert values["loss"] == pytest.approx(want, rel=1e-6, abs=1e-6)
    for (_, values), (_, want) in zip(seen, logger_windows_ref(acc, every)):
        assert values["acc"] == pytest.approx(want, rel=1e-12)
    np.testing.assert_array_equal(log.history("loss"), loss.astype(np.float32).astype(np.float64))
    np.testing.assert_allclose(log.history("acc"), acc, rtol=1e-7)  # float32 per-step storage
    steps_seen, _ = log.history("lr", with_steps=True)
    np.testing.assert_array_equal(steps_seen, np.arange(1, steps + 1))
    assert summary["acc"]["mean"] == pytest.approx(acc.mean(), rel=1e-12)
    assert summary["loss"]["count"] == steps and summary["acc"]["max"] == pytest.approx(acc.max())
    assert log.latest()["acc"] == pytest.approx(seen[-1][1]["acc"])
    assert log.step == steps and log.pending_windows == 0


def test_metrics_may_come_and_go(rng):
    seen = []
    log = ga.LossLogger(4, on_log=lambda s, v: seen.append((s, v)))
    for i in range(12):
        if i % 3 == 0:
            log.log(loss=float(i), val=float(-i))
        else:
            log.log(loss=float(i))
    log.flush()
    assert [s for s, _ in seen] == [4, 8, 12]
    assert seen[0][1] == {"loss": 1.5, "val": -1.5}  # steps 1..4: val at 1 and 4
    assert seen[1][1] == {"loss": 5.5, "val": -6.0}  # val only at step 7 (i=6)
    steps, values = log.history("val", with_steps=True)
    assert steps.tolist() == [1, 4, 7, 10] and values.tolist() == [0.0, -3.0, -6.0, -9.0]
    assert log.metric_names == ["loss", "val"]


def test_first_nonfinite_step_and_raise(rng):
    log = ga.LossLogger(5)
    for i in range(20):
        log.log(loss=math.nan if i in (7, 12) else 1.0, other=math.inf if i == 16 else 0.0)
    summary = log.flush()
    assert log.nonfinite_step == 8 and log.nonfinite_metric == "loss"
    assert summary["loss"]["nonfinite"] == 2 and summary["other"]["nonfinite"] == 1
    assert math.isnan(summary["loss"]["mean"]) and summary["loss"]["finite_mean"] == 1.0
    assert summary["loss"]["count"] == 20

    raising = ga.LossLogger(3, raise_on_nonfinite=True)
    raising.log(loss=1.0)
    raising.log(loss=float("inf"))
    raising.log(loss=2.0)  # closes the window: the inf is now known
    with pytest.raises(ga.NonFiniteError, match="'loss' was inf at step 2"):
        raising.log(loss=3.0)
    raising.log(loss=4.0)  # raised once


@pytest.mark.parametrize("values", [
    [1.0, math.nan, math.nan, 3.0],       # the NaNs show: the window's mean is NaN
    [1.0, math.inf, 2.0, 5.0],            # inf
    [-math.inf, 0.5, -math.inf, 2.0],     # -inf
    [math.inf, 1.0, -math.inf, 2.0],      # inf - inf: NaN
    [math.nan, math.inf, 1.0, 1.0],
    [2.0, 3.0, 5.0, 7.5],                 # finite: the plain mean
])
@pytest.mark.parametrize("kind", ["float", "tensor"])
def test_a_nonfinite_value_makes_its_window_mean_nonfinite_like_torch(values, kind):
    seen = []
    log = ga.LossLogger(4, on_log=lambda step, v: seen.append(v["loss"]))
    for v in values + [1.0, 2.0, 3.0, 4.0]:  # a second, finite window
        log.log(loss=torch.tensor(v, dtype=torch.float32) if kind == "tensor" else v)
    summary = log.flush()
    want = float(torch.tensor(values, dtype=torch.float64).mean())
    assert len(seen) == 2 and seen[1] == 2.5  # the next window is not affected
    if math.isnan(want):
        assert math.isnan(seen[0])
    else:
        assert seen[0] == pytest.approx(want)
    bad = sum(1 for v in values if not math.isfinite(v))
    assert summary["loss"]["nonfinite"] == bad and summary["loss"]["count"] == 8
    assert math.isnan(summary["loss"]["mean"]) == (bad > 0)
    finite = [v for v in values + [1.0, 2.0, 3.0, 4.0] if math.isfinite(v)]
    assert summary["loss"]["finite_mean"] == pytest.approx(sum(finite) / len(finite))


@pytest.mark.parametrize("end", ["flush", "close", "with"])
def test_raise_on_nonfinite_raises_for_the_last_window_at_flush_or_close(end):
    log = ga.LossLogger(2, raise_on_nonfinite=True)
    log.log(loss=1.0)
    log.log(loss=math.inf)
    with pytest.raises(ga.NonFiniteError, match="'loss' was inf at step 2"):
        if end == "with":
            with log:
                pass
        else:
            getattr(log, end)()
    if end == "flush":  # raised once, not again by the next call
        log.log(loss=1.0)
        assert log.flush()["loss"]["nonfinite"] == 1
        log.close()


def test_raise_on_nonfinite_in_a_partial_window():
    log = ga.LossLogger(50, raise_on_nonfinite=True)
    for v in (1.0, 2.0, math.nan):
        log.log(loss=v)
    with pytest.raises(ga.NonFiniteError, match="'loss' was nan at step 3"):
        log.close()
    with pytest.raises(RuntimeError, match="closed"):
        log.log(loss=1.0)


def test_bad_values_name_the_metric():
    log = ga.LossLogger(2)
    with pytest.raises(TypeError, match="metric 'loss' must be a 0-d or one-element"):
        log.log(loss="0.5")
    with pytest.raises(TypeError, match="metric 'flag'"):
        log.log(flag=True)
    with pytest.raises(ValueError, match="'loss' must have exactly one element, it has 3"):
        log.log(loss=torch.ones(3))
    with pytest.raises(ValueError, match="exactly one element"):
        log.log(loss=ga.zeros(2))
    with pytest.raises(TypeError, match="keywords"):
        log.log(1.0)
    small = ga.LossLogger(2, max_metrics=2)
    small.log(a=1.0, b=2.0)
    with pytest.raises(ValueError, match="max_metrics=2"):
        small.log(c=3.0)
    assert log.step == 0  # nothing was recorded by the failed calls


@pytest.mark.parametrize(
    "kwargs,exc,words",
    [
        (dict(every=0), ValueError, "every"),
        (dict(every=10, capacity=5), ValueError, "capacity"),
        (dict(on_log=3), TypeError, "on_log"),
        (dict(progress=object()), TypeError, "tqdm"),
        (dict(reduce="sum"), ValueError, "reduce"),
        (dict(reduce="mean"), RuntimeError, "torch.distributed"),
        (dict(max_metrics=65), ValueError, "max_metrics"),
        (dict(stream="s"), TypeError, "stream"),
    ],
)
def test_bad_arguments(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        ga.LossLogger(**kwargs)


def test_progress_bar_postfix_and_context_manager():
    tqdm = pytest.importorskip("tqdm")
    bar = tqdm.tqdm(total=10, disable=True)
    with ga.LossLogger(2, progress=bar) as log:
        for i in range(10):
            log.log(loss=float(i))
    assert bar.postfix == "loss=8.5"
    with pytest.raises(RuntimeError, match="closed"):
        log.log(loss=1.0)


def test_history_of_unknown_metric():
    log = ga.LossLogger(2)
    log.log(loss=1.0)
    with pytest.raises(KeyError, match="no values of 'acc'.*'loss'"):
        log.history("acc")


def test_logging_cpu_tensors_is_cheap_and_exact():
    log = ga.LossLogger(100)
    t = torch.tensor(2.5, dtype=torch.bfloat16)
    for _ in range(1000):
        log.log(loss=t)
    assert log.flush()["loss"]["mean"] == 2.5


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_distributed_mean_over_two_gloo_processes(tmp_path):
    script = textwrap.dedent(
        """
        import json, os, sys
        import torch, torch.distributed as dist
        import gpuaccel as ga
        rank = int(sys.argv[1])
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % sys.argv[2], rank=rank, world_size=2)
        seen = []
        log = ga.LossLogger(4, reduce="mean", on_log=lambda s, v: seen.append((s, v)))
        for i in range(12):
            value = float(i) if rank == 0 else 100.0 + i   # rank 1 logs 100 more
            log.log(loss=torch.tensor(value), count=1.0 if rank == 0 else 3.0,
                    bad=float("nan") if (rank == 1 and i == 5) else 0.0)
        summary = log.flush()
        json.dump({"seen": seen, "first_bad": log.nonfinite_step, "summary": summary["bad"]},
                  open(sys.argv[3] + "/rank%d.json" % rank, "w"))
        dist.destroy_process_group()
        """
    )
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, "-c", script, str(r), port, str(tmp_path)], cwd=tempfile.gettempdir(),
                              env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    import json

    results = [json.load(open(tmp_path / ("rank%d.json" % r))) for r in range(2)]
    for res in results:
        windows = res["seen"]
        assert [w[0] for w in windows] == [4, 8, 12]
        # global mean of rank 0's i and rank 1's 100+i over each window of 4 steps
        for k, (_, values) in enumerate(windows):
            steps = np.arange(4 * k, 4 * k + 4)
            assert values["loss"] == pytest.approx((steps.sum() + (100 + steps).sum()) / 8)
            assert values["count"] == pytest.approx(2.0)
        assert res["first_bad"] == 6  # found on rank 1, known on both
        assert res["summary"]["nonfinite"] == 1
        # rank 1's NaN (step 6) shows in the second window's mean on both ranks
        assert [math.isnan(values["bad"]) for _, values in windows] == [False, True, False]
