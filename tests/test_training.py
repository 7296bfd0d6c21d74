"""Training and deployment as the guides do them, with the fused layers in
place of torch's: ONNX export (both exporters) checked in onnxruntime,
activation checkpointing, gradient accumulation (and DDP's no_sync),
autocast with a GradScaler, torch.compile, and the profiler's names.
Gradients are compared with torch's unfused layers holding the same
weights."""

import os

import numpy as np
import pytest

import gpuaccel as ga

from helpers import run_python

torch = pytest.importorskip("torch")
import gpuaccel.torch as gt  # noqa: E402 - after torch's importorskip

F = torch.nn.functional


def models(seed=0, dtype=torch.float32):
    """A small CNN twice: gpuaccel's fused layers, and torch's unfused
    layers (with the activation modules real models use) with the same
    weights."""
    torch.manual_seed(seed)
    fused = torch.nn.Sequential(
        gt.FusedConv2d(3, 6, 3, padding=1, activation="relu"), torch.nn.MaxPool2d(2),
        gt.FusedConv2d(6, 5, 3, padding=1, activation="hardswish"), torch.nn.Flatten(),
        gt.FusedLinear(5 * 4 * 4, 12, activation="gelu"), gt.FusedLinear(12, 7, activation="silu"),
        gt.FusedLinear(7, 4)).to(dtype)
    plain = torch.nn.Sequential(
        torch.nn.Conv2d(3, 6, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(6, 5, 3, padding=1), torch.nn.Hardswish(), torch.nn.Flatten(),
        torch.nn.Linear(5 * 4 * 4, 12), torch.nn.GELU(), torch.nn.Linear(12, 7),
        torch.nn.SiLU(), torch.nn.Linear(7, 4)).to(dtype)
    with torch.no_grad():
        for p, q in zip(plain.parameters(), fused.parameters()):
            p.copy_(q)
    return fused, plain


def batch(n=5, seed=1, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 8, 8, generator=g).to(dtype), torch.randint(0, 4, (n,), generator=g)


def grads(model):
    return [p.grad.detach().clone() for p in model.parameters()]


def assert_grads_equal(fused, plain, rtol=1e-5, atol=1e-6):
    for (name, p), q in zip(fused.named_parameters(), plain.parameters()):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, rtol=rtol, atol=atol, msg=name)


# -------------------------------------------------------------------- ONNX

# the TorchScript exporter is deprecated in torch >= 2.9 (and says so); the users still call it
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("route", ["torchscript", "dynamo", "exported_program"])
def test_onnx_export_uses_standard_ops_and_runs_in_onnxruntime(route, tmp_path):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    fused, _ = models()
    fused.append(gt.FusedLinear(4, 4 * 3 * 3, activation="sigmoid"))
    fused.append(torch.nn.Unflatten(1, (4, 3, 3)))
    fused.append(gt.FusedConv2d(4, 3, 2, stride=2, padding=1, activation="gelu_tanh"))
    fused.append(gt.FusedConv2d(3, 2, 1))  # and a conv without activation
    fused.eval()
    x, _ = batch(3)
    path = str(tmp_path / "model.onnx")
    if route == "exported_program":  # torch.export first (the custom ops), then the ONNX exporter
        program = torch.export.export(fused, (x,))
        kept = {str(node.target) for node in program.run_decompositions().graph.nodes}
        assert {"gpuaccel.linear.default", "gpuaccel.conv2d.default"} <= kept  # elsewhere, the fused ops stay
        torch.onnx.export(program, (x,), path)
    else:
        torch.onnx.export(fused, (x,), path, dynamo=route == "dynamo")
    graph = onnx.load(path).graph
    ops = {(n.domain, n.op_type) for n in graph.node}
    assert all(domain in ("", "ai.onnx") for domain, _ in ops), ops  # no custom domain: any runtime runs it
    kinds = {op for _, op in ops}
    assert "Conv" in kinds and ("Gemm" in kinds or "MatMul" in kinds) and "Relu" in kinds, kinds
    assert "Sigmoid" in kinds, kinds  # sigmoid, and silu as x * Sigmoid(x)
    # both GELUs: ONNX's Gelu (with its approximate attribute) or their expansions with Erf and Tanh
    gelus = sorted({a.s for n in graph.node if n.op_type == "Gelu" for a in n.attribute
                    if a.name == "approximate"} | {b"none" for n in graph.node if n.op_type == "Gelu"
                                                  and not n.attribute})
    assert ("Erf" in kinds or b"none" in gelus) and ("Tanh" in kinds or b"tanh" in gelus), (kinds, gelus)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    x2, _ = batch(3, seed=7)  # other values than the ones traced (the same shape: exports are static here)
    for inp in (x, x2):
        got = session.run(None, {session.get_inputs()[0].name: inp.numpy()})[0]
        with torch.no_grad():
            np.testing.assert_allclose(got, fused(inp).numpy(), rtol=1e-4, atol=1e-5)


# ----------------------------------------------- checkpointing, accumulation

@pytest.mark.parametrize("use_reentrant", [False, True])
def test_activation_checkpointing_gives_the_unfused_gradients(use_reentrant):
    from torch.utils.checkpoint import checkpoint, checkpoint_sequential

    fused, plain = models()
    x, y = batch()
    x.requires_grad_(True)
    x_plain = x.detach().clone().requires_grad_(True)
    out = checkpoint_sequential(fused, 3, x, use_reentrant=use_reentrant)
    F.cross_entropy(out, y).backward()
    F.cross_entropy(plain(x_plain), y).backward()
    assert_grads_equal(fused, plain)
    torch.testing.assert_close(x.grad, x_plain.grad, rtol=1e-5, atol=1e-6)
    # one layer under checkpoint(): its forward runs again in the backward
    layer = gt.FusedLinear(9, 6, activation="gelu")
    ref = torch.nn.Linear(9, 6)
    ref.load_state_dict(layer.state_dict())
    v = torch.randn(4, 9, requires_grad=True)
    checkpoint(layer, v, use_reentrant=use_reentrant).square().sum().backward()
    F.gelu(ref(v.detach())).square().sum().backward()
    torch.testing.assert_close(layer.weight.grad, ref.weight.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(layer.bias.grad, ref.bias.grad, rtol=1e-5, atol=1e-6)


def test_gradient_accumulation_over_micro_batches_equals_one_big_batch():
    fused, plain = models()
    x, y = batch(12)
    for xm, ym in zip(x.split(4), y.split(4)):  # three micro-batches, the loss scaled as the guides do
        (F.cross_entropy(fused(xm), ym) / 3).backward()
    F.cross_entropy(plain(x), y).backward()  # one batch of all twelve
    assert_grads_equal(fused, plain)


def test_ddp_no_sync_accumulates_then_syncs(tmp_path):
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        fused, plain = models()
        ddp_fused = torch.nn.parallel.DistributedDataParallel(fused)
        ddp_plain = torch.nn.parallel.DistributedDataParallel(plain)
        x, y = batch(8)
        for model in (ddp_fused, ddp_plain):
            with model.no_sync():  # the first micro-batch: no all-reduce
                F.cross_entropy(model(x[:4]), y[:4]).backward()
            F.cross_entropy(model(x[4:]), y[4:]).backward()  # the last: all-reduce of the sum
        assert_grads_equal(fused, plain)
    finally:
        dist.destroy_process_group()


# Each of two ranks accumulates two micro-batches of its own quarter-batches
# under no_sync(), then syncs: the gradients are those of the whole batch in
# torch's unfused model, equal on both ranks, and differed before the sync.
DDP_TWO_RANKS = """
import gc
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, %r)
from test_training import batch, models

dist.init_process_group("gloo")
rank = dist.get_rank()
fused, plain = models()
model = torch.nn.parallel.DistributedDataParallel(fused)
x, y = batch(16)
mine = [(x[i:i + 4], y[i:i + 4]) for i in (8 * rank, 8 * rank + 4)]
with model.no_sync():
    (F.cross_entropy(model(mine[0][0]), mine[0][1]) / 2).backward()
local = fused[0].weight.grad.clone()
gathered = [torch.empty_like(local) for _ in range(2)]
dist.all_gather(gathered, local)
assert not torch.equal(gathered[0], gathered[1]), "no_sync() all-reduced"
(F.cross_entropy(model(mine[1][0]), mine[1][1]) / 2).backward()
F.cross_entropy(plain(x), y).backward()
for (name, p), q in zip(fused.named_parameters(), plain.parameters()):
    torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)
dist.all_gather(gathered, fused[0].weight.grad)
assert torch.equal(gathered[0], gathered[1])
# DDP's reducer and Gloo's pending work freed while the interpreter is whole,
# and no interpreter teardown after: Gloo's worker threads can abort the
# process there ("terminate called without an active exception", SIGABRT
# after both ranks printed ok: seen twice in loaded runs here)
del model, gathered
gc.collect()
dist.destroy_process_group()
print("rank %%d ok" %% rank, flush=True)
sys.stderr.flush()
os._exit(0)
"""


def test_ddp_no_sync_on_two_gloo_ranks_gives_the_whole_batch_gradients(tmp_path):
    script = tmp_path / "ddp_two_ranks.py"
    script.write_text(DDP_TWO_RANKS % os.path.dirname(os.path.abspath(__file__)))
    proc = run_python("-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script),
                      timeout=300, env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "rank 0 ok" in proc.stdout and "rank 1 ok" in proc.stdout


# --------------------------------------------------------- mixed precision

def test_autocast_bf16_with_a_grad_scaler_on_the_cpu():
    fused, plain = models()
    x, y = batch(6)
    scalers = [torch.amp.GradScaler("cpu", init_scale=2.0 ** 8) for _ in range(2)]
    for model, scaler in zip((fused, plain), scalers):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
            assert out.dtype == torch.bfloat16  # computed in the autocast dtype, as torch's layers
            loss = F.cross_entropy(out.float(), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
    # bf16 arithmetic on both sides, different kernels: bf16-sized tolerances
    for (name, p), q in zip(fused.named_parameters(), plain.parameters()):
        scale = float(q.grad.abs().max()) + 1e-3
        torch.testing.assert_close(p.grad, q.grad, rtol=0.05, atol=0.03 * scale, msg=name)


@pytest.mark.cuda
@pytest.mark.gpu
def test_autocast_fp16_with_a_grad_scaler_on_cuda():
    fused, plain = (m.cuda() for m in models())
    x, y = (t.cuda() for t in batch(6))
    for model in (fused, plain):
        scaler = torch.amp.GradScaler("cuda")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = F.cross_entropy(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
    for (name, p), q in zip(fused.named_parameters(), plain.parameters()):
        scale = float(q.grad.abs().max()) + 1e-3
        torch.testing.assert_close(p.grad, q.grad, rtol=0.01, atol=0.01 * scale, msg=name)


# ------------------------------------------------------------ torch.compile

def test_torch_compile_gives_the_eager_gradients():
    fused, plain = models()
    x, y = batch()
    compiled = torch.compile(fused, backend="aot_eager", fullgraph=True)  # the custom ops, no graph break
    F.cross_entropy(compiled(x), y).backward()
    F.cross_entropy(plain(x), y).backward()
    assert_grads_equal(fused, plain)


# ----------------------------------------------------------------- profiler

def test_a_profiled_training_step_names_the_gpuaccel_ops():
    fused, _ = models()
    x = np.random.default_rng(0).random((8, 3, 8, 8), dtype=np.float32)
    loader = ga.PinnedLoader([x, np.arange(8) % 4], 4)
    log = ga.LossLogger(2)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for images, labels in loader:
            loss = F.cross_entropy(fused(images), labels)
            loss.backward()
            log.log(loss=loss.detach())
            ga.matmul(np.ones((3, 4), np.float32), np.ones((4, 2), np.float32))  # a plain op too
    log.close()
    names = {e.key for e in prof.key_averages()}
    for op in ("conv2d", "conv2d_backward", "linear", "linear_backward", "matmul", "loader_batch",
               "logger_update"):
        assert "gpuaccel::" + op in names, sorted(n for n in names if "gpuaccel" in n)
