"""matmul, linear and conv2d on the CUDA backend, against the CPU backend
(the oracle, itself tested against float64 references in test_matmul.py and
test_conv.py) and against torch on the GPU."""

import numpy as np
import pytest

import gpuaccel as ga

from helpers import ACTIVATIONS, FLOAT_DTYPES, LONG_SLEEP_CYCLES, UNIT_ROUNDOFF, assert_within

torch = pytest.importorskip("torch")
F = torch.nn.functional

pytestmark = pytest.mark.cuda

# |gpu - cpu| <= atol * sqrt(K) + rtol * |cpu|: both accumulate in float32
# (float64 for float64) but in different orders.  16-bit results: each side
# is within its roundings to the output dtype of its float32 sums: the CPU
# rounds once; the GPU's unfused path rounds the GEMM's output, then again
# after the bias and activation, so its first rounding is an ulp of the
# product before the bias (`before`), not of the result.  The bound is those
# roundings (a few ulps, helpers.UNIT_ROUNDOFF) of the larger of the two,
# plus float32 accumulation on both sides: not a percent.
TOL = {"float64": (1e-12, 1e-12), "float32": (2e-5, 2e-5)}
ROUNDINGS = 4  # 1 on the CPU, 2 on the GPU, the first times the activation's slope (<= 1.5) and the sums' order
# the largest |act'(z)| of each activation whose derivative reads z, for the flips of close()
SLOPE = {"gelu": 1.13, "gelu_tanh": 1.13, "silu": 1.1, "hardswish": 1.5, "sigmoid": 0.25}


def close(got, ref, dtype, k, flip=0.0, before=None):
    """`before`: the float64 product before bias and activation, where the
    GPU may round it.  `flip`: for a sum over terms both sides round to 16
    bits first (the GELU backward's activation gradient), the largest such
    term: the two may round one near a midpoint to different neighbours."""
    g, r = f64(got), f64(ref)
    if dtype in ("float16", "bfloat16"):
        u = UNIT_ROUNDOFF[dtype]
        scale = np.abs(r) if before is None else np.maximum(np.abs(r), np.abs(before))
        bound = 2 * 16 * UNIT_ROUNDOFF["float32"] * np.sqrt(max(k, 1)) + 2 * 2 * u * flip + ROUNDINGS * u * scale
        err = np.abs(g - r)
        bad = ~(err <= bound)
        assert not bad.any(), "%d of %d elements off; worst %g (bound there %g)" % (
            bad.sum(), bad.size, err[bad].max(), bound[bad][np.argmax(err[bad])])
    else:
        assert_within(g, r, *TOL[dtype], k)


def f64(a):
    return np.asarray(a.to("cpu").astype("float64").numpy())


def biggest(a):
    v = f64(a)
    return float(np.abs(v).max()) if v.size else 0.0


def pair(rng, shape, dtype):
    """The same values on the CPU and on the GPU."""
    cpu = ga.asarray(rng.standard_normal(shape)).astype(dtype)
    return cpu, cpu.to("cuda")


@pytest.fixture(autouse=True)
def highest_precision():
    # full float32 (the tolerances below are float32's): convs default to TF32, as torch's do
    ga.set_matmul_precision("highest")
    ga.set_conv_allow_tf32(False)
    yield
    ga.set_matmul_precision(None)
    ga.set_conv_allow_tf32(None)
    ga.set_deterministic(False)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 5, 3), (129, 33, 65), (257, 1000, 17), (3, 0, 4), (0, 5, 6)])
@pytest.mark.parametrize("activation", [None] + ACTIVATIONS)
def test_matmul_matches_cpu(rng, dtype, m, k, n, activation):
    a, ag = pair(rng, (m, k), dtype)
    b, bg = pair(rng, (k, n), dtype)
    bias, biasg = pair(rng, (n,), dtype)
    ref = ga.matmul(a, b, bias=bias, activation=activation)
    got = ga.matmul(ag, bg, bias=biasg, activation=activation)
    assert got.device.type == "cuda" and got.dtype == dtype
    close(got, ref, dtype, k, before=f64(a) @ f64(b))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_batched_broadcast_transposed_and_offset_operands(rng, dtype):
    a, ag = pair(rng, (3, 1, 37, 29), dtype)
    b, bg = pair(rng, (4, 29, 23), dtype)
    close(ga.matmul(ag, bg), ga.matmul(a, b), dtype, 29)
    # a transposed B, and views that start one element in (misaligned for
    # cuBLASLt's vector loads): still right, through a fallback if need be
    big, bigg = pair(rng, (41, 31), dtype)
    close(ga.matmul(bigg[1:, 1:], bigg[1:, 1:].T), ga.matmul(big[1:, 1:], big[1:, 1:].T), dtype, 30)
    # a column-strided operand no cuBLASLt layout describes: the generic kernel
    close(ga.matmul(bigg[::2, ::3], bigg[::4, ::2]), ga.matmul(big[::2, ::3], big[::4, ::2]), dtype, 11)


@pytest.mark.gpu
def test_misaligned_bias_falls_back_and_is_counted(rng):
    a, ag = pair(rng, (64, 64), "float16")
    b, bg = pair(rng, (64, 65), "float16")
    before = ga.matmul_stats()
    got = ga.matmul(ag, bg[:, :64], bias=bg[0, 1:], activation="gelu")
    after = ga.matmul_stats()
    close(got, ga.matmul(a, b[:, :64], bias=b[0, 1:], activation="gelu"), "float16", 64,
          before=f64(a) @ f64(b[:, :64]))
    assert after["fallback"] >= before["fallback"] + 1


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("activation", [None] + ACTIVATIONS)
@pytest.mark.parametrize("shape", [(5, 33), (2, 3, 129), (6, 0)])  # in_features 0: grad_bias still sums
def test_linear_forward_and_backward_match_cpu(rng, dtype, activation, shape):
    out_features = 47
    x, xg = pair(rng, shape, dtype)
    w, wg = pair(rng, (out_features, shape[-1]), dtype)
    b, bg = pair(rng, (out_features,), dtype)
    y, aux = ga.linear(x, w, b, activation=activation, save_preactivation=True)
    yg, auxg = ga.linear(xg, wg, bg, activation=activation, save_preactivation=True)
    close(yg, y, dtype, shape[-1], before=f64(x) @ f64(w).T)
    gy, gyg = pair(rng, y.shape, dtype)
    # the backward gets the same saved tensor on both sides
    aux_same = None if aux is None else aux
    auxg_same = None if aux is None else aux.to("cuda")
    ref = ga.linear_backward(gy, x, w, activation=activation, preactivation=aux_same)
    got = ga.linear_backward(gyg, xg, wg, activation=activation, preactivation=auxg_same)
    rows = int(np.prod(shape[:-1]))
    flip = SLOPE.get(activation, 0.0) * biggest(gy) * max(biggest(x), biggest(w))
    for g, r, k in zip(got, ref, (out_features, rows, rows)):
        close(g, r, dtype, k, flip)


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_each_activation_takes_its_documented_route(rng, activation):
    """A linear's activation fuses into cuBLASLt's epilogue where cuBLASLt
    has one (relu, tanh-GELU); the others take the split route (GEMM + bias
    in cuBLASLt, then gpuaccel's kernel), counted as a documented
    'epilogue' fallback — never a warning or, under the tests' 'raise'
    policy, an error.  A conv's fuses into cuDNN's graph where cuDNN has an
    engine for it (runtime fusion: not on every GPU), hardswish never (no
    pointwise mode)."""
    x, xg = pair(rng, (96, 136), "bfloat16")
    w, wg = pair(rng, (72, 136), "bfloat16")
    b, bg = pair(rng, (72,), "bfloat16")
    before = ga.matmul_stats()
    yg, auxg = ga.linear(xg, wg, bg, activation=activation, save_preactivation=True)
    after = ga.matmul_stats()
    y, aux = ga.linear(x, w, b, activation=activation, save_preactivation=True)
    close(yg, y, "bfloat16", 136, before=f64(x) @ f64(w).T)
    if activation in SLOPE:
        close(auxg, aux, "bfloat16", 136)
    grown = {k: after["fallback_reasons"][k] - before["fallback_reasons"][k] for k in after["fallback_reasons"]}
    if activation in ("relu", "gelu_tanh"):
        assert after["fused"] == before["fused"] + 1 and not any(grown.values()), (before, after)
    else:
        assert after["fused"] == before["fused"] and after["fallback"] == before["fallback"] + 1
        assert grown["epilogue"] == 1 and sum(grown.values()) == 1, grown
    c, cg = pair(rng, (2, 16, 12, 10), "bfloat16")
    k, kg = pair(rng, (24, 16, 3, 3), "bfloat16")
    cb, cbg = pair(rng, (24,), "bfloat16")
    before = ga.conv_stats()
    yc = ga.conv2d(cg, kg, cbg, padding=1, activation=activation, layout="NCHW")
    after = ga.conv_stats()
    # cuDNN's fused GELUs may evaluate 1 + erf / 1 + tanh apart from the CPU: a
    # rounding of z's size where the two nearly cancel (z < 0)
    z64 = f64(ga.conv2d(c.astype("float64"), k.astype("float64"), cb.astype("float64"), padding=1))
    close(yc, ga.conv2d(c, k, cb, padding=1, activation=activation), "bfloat16", 144, before=z64)
    grown = {r: after["fallback_reasons"][r] - before["fallback_reasons"][r] for r in after["fallback_reasons"]}
    if activation == "hardswish":
        assert after["fused"] == before["fused"] and grown["epilogue"] == 1, (before, after)
    else:  # fused, or a documented limit: no engine for the fused graph here
        assert after["fused"] == before["fused"] + 1 or grown["not_supported"] == 1, (before, after)


def test_deterministic_mode_gives_identical_bits(rng):
    ga.set_deterministic(True)
    x, xg = pair(rng, (4097, 515), "float32")
    w, wg = pair(rng, (257, 515), "float32")
    gy, gyg = pair(rng, (4097, 257), "float32")
    first = [g.numpy() for g in map(lambda t: t.to("cpu"), ga.linear_backward(gyg, xg, wg))]
    second = [g.numpy() for g in map(lambda t: t.to("cpu"), ga.linear_backward(gyg, xg, wg))]
    for a, b in zip(first, second):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("activation", [None] + ACTIVATIONS)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("geometry", [
    # n, c, h, w, k, r, s, stride, padding, dilation, groups
    (2, 3, 17, 13, 8, 3, 3, 1, 1, 1, 1),
    (3, 16, 9, 11, 24, 3, 3, 2, 1, 1, 1),
    (1, 8, 10, 10, 8, 5, 3, (1, 2), (2, 0), (1, 2), 2),
    (2, 32, 7, 7, 64, 1, 1, 1, 0, 1, 1),
])
def test_conv2d_matches_cpu(rng, dtype, activation, layout, geometry):
    n, c, h, w, k, r, s, stride, padding, dilation, groups = geometry
    geo = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout)
    xs = (n, c, h, w) if layout == "NCHW" else (n, h, w, c)
    ws = (k, c // groups, r, s) if layout == "NCHW" else (k, r, s, c // groups)
    x, xg = pair(rng, xs, dtype)
    wt, wtg = pair(rng, ws, dtype)
    b, bg = pair(rng, (k,), dtype)
    y, aux = ga.conv2d(x, wt, b, activation=activation, save_preactivation=True, **geo)
    before, policy = ga.conv_stats(), ga.get_fallback_policy()
    if activation == "sigmoid" and dtype == "float32":
        # seen on an H200 (cuDNN 9, full float32): the fused conv + bias +
        # sigmoid graph's plans finalize but none executes; the split route
        # then runs, under a FallbackWarning ('execution_failed') by default
        ga.set_fallback_policy("allow")
    try:
        yg, auxg = ga.conv2d(xg, wtg, bg, activation=activation, save_preactivation=True, **geo)
    finally:
        ga.set_fallback_policy(policy)
    grown = {r: ga.conv_stats()["fallback_reasons"][r] - n for r, n in before["fallback_reasons"].items()}
    assert not any(n for r, n in grown.items() if r not in ("epilogue", "not_supported", "execution_failed")), grown
    assert not grown["execution_failed"] or (activation, dtype) == ("sigmoid", "float32"), grown
    red = c // groups * r * s
    # the GPU may round the product (unfused) or the pre-activation z (the
    # split route stores it; cuDNN's fused GELUs lose digits of z's size where
    # 1 + erf or 1 + tanh nearly cancel): the bound scales with the larger
    product = f64(ga.conv2d(x.astype("float64"), wt.astype("float64"), **geo))
    z64 = f64(ga.conv2d(x.astype("float64"), wt.astype("float64"), b.astype("float64"), **geo))
    close(yg, y, dtype, red, before=np.maximum(np.abs(product), np.abs(z64)))
    gy, gyg = pair(rng, y.shape, dtype)
    kw = {}
    if activation in SLOPE:  # the derivative reads the pre-activation
        kw = dict(preactivation=(aux, aux.to("cuda")))
    elif activation == "relu":
        kw = dict(y=(y, y.to("cuda")))
    ref = ga.conv2d_backward(gy, x, wt, activation=activation, **{k_: v[0] for k_, v in kw.items()}, **geo)
    got = ga.conv2d_backward(gyg, xg, wtg, activation=activation, **{k_: v[1] for k_, v in kw.items()}, **geo)
    pixels = n * y.size // (n * k)
    flip = SLOPE.get(activation, 0.0) * biggest(gy) * max(biggest(x), biggest(wt))
    for g, rr, kk in zip(got, ref, (k * r * s, pixels, pixels)):
        close(g, rr, dtype, kk, flip)


# ------------------------------------------------------------------ torch

@pytest.mark.gpu
def test_fused_linear_on_cuda_matches_torch_and_uses_torchs_stream():
    import gpuaccel.torch as gt

    torch.manual_seed(0)
    layer = gt.FusedLinear(129, 257, activation="gelu").cuda()
    ref = torch.nn.Linear(129, 257).cuda()
    ref.load_state_dict(layer.state_dict())
    x = torch.randn(33, 129, device="cuda", requires_grad=True)
    xr = x.detach().clone().requires_grad_(True)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        y = layer(x)
        yr = F.gelu(ref(xr))
        (y.square().sum()).backward()
        (yr.square().sum()).backward()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, yr, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(layer.weight.grad, ref.weight.grad, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(layer.bias.grad, ref.bias.grad, rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
def test_raw_ops_on_torch_tensors_follow_torchs_current_stream():
    # torch writes x on a side stream after a long sleep; ga.linear with no
    # stream= must queue behind that work, on the same stream
    w = torch.randn(65, 129, device="cuda")
    side = torch.cuda.Stream()
    x = torch.zeros(33, 129, device="cuda")
    torch.cuda.synchronize()
    values = torch.randn(33, 129, device="cuda")
    side.wait_stream(torch.cuda.current_stream())  # values and w are written
    with torch.cuda.stream(side):
        torch.cuda._sleep(LONG_SLEEP_CYCLES)
        x.copy_(values)
        y = torch.empty(33, 65, device="cuda")
        ga.linear(x, w, out=y)
        matmul_y = torch.empty(33, 65, device="cuda")
        ga.matmul(x, w.T, out=matmul_y)
    side.synchronize()
    ref = values.double() @ w.double().T
    torch.testing.assert_close(y.double(), ref, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(matmul_y.double(), ref, rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
def test_autocast_bf16_on_cuda():
    import gpuaccel.torch as gt

    layer = gt.FusedLinear(64, 96, activation="relu").cuda()
    conv = gt.FusedConv2d(3, 8, 3, padding=1, activation="relu").cuda()
    x, img = torch.randn(10, 64, device="cuda"), torch.randn(2, 3, 9, 9, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = layer(x)
        z = conv(img)
    assert y.dtype == torch.bfloat16 and z.dtype == torch.bfloat16
    # the values: bf16-rounded operands, float64 arithmetic; the bound is a few bf16 ulps of the output

    def bf16(t):
        return t.to(torch.bfloat16).double()

    y_ref = torch.relu(bf16(x) @ bf16(layer.weight).T + bf16(layer.bias))
    z_ref = torch.relu(torch.nn.functional.conv2d(bf16(img), bf16(conv.weight), bf16(conv.bias), padding=1))
    torch.testing.assert_close(y.double(), y_ref, rtol=2 * 2.0 ** -8, atol=1e-2)
    torch.testing.assert_close(z.double(), z_ref, rtol=2 * 2.0 ** -8, atol=1e-2)


@pytest.mark.gpu
def test_cuda_graph_capture_replays_the_fused_ops():
    import gpuaccel.torch as gt

    layer = gt.FusedLinear(64, 64, activation="gelu").cuda()
    static_x = torch.randn(16, 64, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):  # warm-up: plans and workspaces exist before capture
            layer(static_x)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = layer(static_x)
    new_x = torch.randn(16, 64, device="cuda")
    static_x.copy_(new_x)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(static_y, layer(new_x), rtol=0, atol=0)
