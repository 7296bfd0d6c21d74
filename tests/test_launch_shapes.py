"""Launch shapes of the CUDA kernels at the benchmarks' sizes, without a GPU.

A kernel is slow on an H100 when it gives the GPU's 132 SMs too few blocks
and each thread a long serial walk (a reduction of 800k elements over 8
blocks, say).  kernels/cudacpu records every launch — its grid, its block,
and, through the GA_TRIP() marks in kernels/cuda, the loop iterations each
thread makes — while it runs only the first and last block of each grid
(enough for the shape, at sizes that would take far too long on the CPU in
full).  This file drives every gpuaccel kernel the benchmarks can reach
(benchmarks/*.py: ResNet-50's convolutions, an MLP's linear layers, every
activation, the loader's batches and images, the logger) through tests/cudacpu/driver.cpp at those
sizes, and asserts that each launch has at least two blocks per SM of an H100
or bounds its threads' serial work.  A second test checks that every loop of
kernels/cuda whose trip count can grow with a problem carries the mark.

Not checked here: occupancy and register use, memory coalescing, and time
itself — only a GPU shows those (.ci/gpu bench).
"""

import ast
import os
import re
import subprocess

import pytest
from test_kernels_on_cpu import ROOT, Directives, driver, kernel_sources

from helpers import tool_env
from ops import ACTIVATIONS, activation

H100_SMS = 132
MIN_BLOCKS = 2 * H100_SMS
# at most this many loop iterations per thread: a few microseconds of
# serial work, whatever the grid
MAX_TRIPS = 256
ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8, "uint8": 1}


def benchmark_constant(script, name):
    """A module-level constant of a benchmark script, read without importing
    it (the scripts import torch and gpuaccel)."""
    tree = ast.parse(open(os.path.join(ROOT, "benchmarks", script)).read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("benchmarks/%s has no %s" % (script, name))


class ShapeCase(Directives):
    """One kernel call of the driver, its buffers zeros that only need to
    exist (the driver maps them lazily: a sampled launch touches few pages)."""

    def __init__(self, name, op):
        self.name = name
        self.lines = ["op " + op, "sides cuda", "record", "sample_blocks"]
        self.buffers = 0

    def _buffer(self, nbytes):
        self.buffers += 1
        name = "b%d" % self.buffers
        self.lines.append("zeros %s %d" % (name, max(nbytes, 1)))
        return name

    def tensor(self, field, dtype, shape, order=None):
        """A dense tensor of `shape` whose memory holds its dims in `order`
        (outermost first; default row-major); strides in bytes."""
        order = list(order if order is not None else range(len(shape)))
        item = ITEMSIZE[dtype]
        strides, step = [0] * len(shape), item
        for d in reversed(order):
            strides[d] = step
            step *= shape[d]
        name = self._buffer(step)
        self.lines.append("tensor %s %s 0 %s %d %s %s" % (field, name, dtype, len(shape),
                                                         " ".join(map(str, shape)), " ".join(map(str, strides))))

    def matrix(self, field, dtype, rows, cols, transposed=False):
        name = self._buffer(rows * cols * ITEMSIZE[dtype])
        rs, cs = (1, rows) if transposed else (cols, 1)
        self.lines.append("matrix %s %s 0 %s %d %d %d %d 0" % (field, name, dtype, rows, cols, rs, cs))

    def ptr(self, field, nbytes):
        self.lines.append("ptr %s %s 0" % (field, self._buffer(nbytes)))


NHWC = (0, 2, 3, 1)  # the memory order of a channels-last (N, C, H, W) tensor


def conv_cases():
    """ResNet-50's layers as bench_conv.py runs them (bfloat16, channels-last
    activations, conv + bias + ReLU, forward and backward), and in NCHW: the
    epilogue kernels of the split and unfused routes and of the backward
    pass (dz and the bias gradient), the copy that stages an NCHW weight
    beside channels-last activations, and the direct kernels (the route
    without cuDNN)."""
    cases = []
    for n, c, k, hw, r in benchmark_constant("bench_conv.py", "RESNET50_SHAPES"):
        p = hw  # stride 1, padding r // 2
        for layout, order in (("nhwc", NHWC), ("nchw", None)):
            tag = "%dx%dx%dx%d->%d r%d %s" % (n, c, hw, hw, k, r, layout)
            y = (n, k, p, p)
            case = ShapeCase("bias_act " + tag, "bias_act")
            case.tensor("x", "bfloat16", y, order)
            case.tensor("y", "bfloat16", y, order)
            case.lines.append("tensor preact - 0 bfloat16 0")
            case.ptr("bias", 2 * k)
            case.dtype("bias_dtype", "bfloat16")
            case.ints("channel_dim", 1)
            case.ints("activation", activation("relu").code)
            cases.append(case)
            case = ShapeCase("act_backward " + tag, "act_backward")
            case.tensor("grad_y", "bfloat16", y, order)
            case.tensor("aux", "bfloat16", y, order)
            case.tensor("dz", "bfloat16", y, order)
            case.ints("activation", activation("relu").code)
            case.ptr("bias_grad", 2 * k)
            case.dtype("bias_grad_dtype", "bfloat16")
            case.ints("channel_dim", 1)
            case.ints("split", 1)  # the workspace csrc/opcall.c gives
            cases.append(case)
            for op, roles in (("conv_fwd", ("x", "w", "y")), ("conv_bwd_data", ("dy", "w", "dx")),
                              ("conv_bwd_filter", ("x", "dy", "dw"))):
                case = ShapeCase("%s %s" % (op, tag), op)
                shapes = {"x": (n, c, hw, hw), "dx": (n, c, hw, hw), "w": (k, c, r, r), "dw": (k, c, r, r),
                          "y": y, "dy": y}
                for role in roles:
                    case.tensor(role, "bfloat16", shapes[role], order)
                case.ints("stride", 1, 1)
                case.ints("padding", r // 2, r // 2)
                case.ints("dilation", 1, 1)
                case.ints("groups", 1)
                if op == "conv_fwd":
                    case.ptr("bias", 2 * k)
                    case.ints("activation", activation("relu").code)
                cases.append(case)
        if r > 1:  # (a 1x1 filter has one layout: no copy)
            case = ShapeCase("copy weight %dx%dx%dx%d to channels-last" % (k, c, r, r), "copy")
            case.tensor("src", "bfloat16", (k, c, r, r))
            case.tensor("dst", "bfloat16", (k, c, r, r), NHWC)
            cases.append(case)
    return cases


def linear_cases():
    """An MLP's layers as bench_matmul.py runs them (bfloat16): what
    ga_cuda_matmul runs when cuBLASLt cannot fuse or run a call — the
    generic GEMM and the epilogue kernels after it, forward (bias,
    activation, saved pre-activation) and backward (the activation's
    gradient with the bias gradient as column sums; the bias gradient fused
    into the weight gradient as row sums of dZ^T)."""
    cases = []
    for tokens, fin, fout, act in benchmark_constant("bench_matmul.py", "LINEAR_SHAPES"):
        tag = "%dx%d->%d %s" % (tokens, fin, fout, act)
        code = activation(act).code
        case = ShapeCase("linear forward " + tag, "matmul")
        case.matrix("a", "bfloat16", tokens, fin)
        case.matrix("b", "bfloat16", fin, fout, transposed=True)
        case.matrix("d", "bfloat16", tokens, fout)
        case.matrix("preact", "bfloat16", tokens, fout)
        case.ptr("bias", 2 * fout)
        case.dtype("bias_dtype", "bfloat16")
        case.ints("activation", code)
        cases.append(case)
        case = ShapeCase("linear dz and bias gradient " + tag, "act_backward")
        case.tensor("grad_y", "bfloat16", (tokens, fout))
        case.tensor("aux", "bfloat16", (tokens, fout))
        case.tensor("dz", "bfloat16", (tokens, fout))
        case.ints("activation", code)
        case.ptr("bias_grad", 4 * fout)
        case.dtype("bias_grad_dtype", "float32")
        case.ints("channel_dim", 1)
        case.ints("split", 1)
        cases.append(case)
        case = ShapeCase("linear input gradient, dact " + tag, "matmul")
        case.matrix("a", "bfloat16", tokens, fout)
        case.matrix("b", "bfloat16", fout, fin)
        case.matrix("d", "bfloat16", tokens, fin)
        case.matrix("dact_aux", "bfloat16", tokens, fin)
        case.ints("dact", code)
        case.ptr("col_sums", 4 * fin)
        case.dtype("col_sums_dtype", "float32")
        case.ints("split", 1)  # ga_cuda_matmul hands its workspace over
        cases.append(case)
        case = ShapeCase("linear weight gradient with row sums " + tag, "matmul")
        case.matrix("a", "bfloat16", fout, tokens, transposed=True)
        case.matrix("b", "bfloat16", tokens, fin)
        case.matrix("d", "bfloat16", fout, fin)
        case.ptr("a_row_sums", 2 * fout)
        case.dtype("a_row_sums_dtype", "bfloat16")
        case.ints("split", 1)
        cases.append(case)
    for size in benchmark_constant("bench_matmul.py", "MATMUL_SIZES"):
        case = ShapeCase("matmul %d^3" % size, "matmul")
        for field in ("a", "b", "d"):
            case.matrix(field, "bfloat16", size, size)
        cases.append(case)
    return cases


def activation_cases():
    """Every activation through the kernels that run it outside cuBLASLt's
    and cuDNN's fused epilogues, at the benchmarks' largest shapes of each
    kind (bench_activations.py runs them all): the split route's
    y = act(z) after the library's GEMM + bias (linears) or conv + bias
    graph (convs: hardswish, which cuDNN has no mode for), and the backward
    pass's dz with the bias gradient."""
    cases = []
    tokens, _, fout, _ = benchmark_constant("bench_matmul.py", "LINEAR_SHAPES")[0]
    n, _, k, hw, _ = benchmark_constant("bench_conv.py", "RESNET50_SHAPES")[0]
    acts = [a.label for a in ACTIVATIONS.values() if a.name is not None]
    for act in acts:
        for kind, shape, order in (("linear %dx%d" % (tokens, fout), (tokens, fout), None),
                                   ("conv %dx%dx%dx%d nhwc" % (n, k, hw, hw), (n, k, hw, hw), NHWC)):
            case = ShapeCase("split activation %s %s" % (act, kind), "bias_act")
            case.tensor("x", "bfloat16", shape, order)  # the pre-activation the library wrote
            case.tensor("y", "bfloat16", shape, order)
            case.lines.append("tensor preact - 0 bfloat16 0")
            case.dtype("bias_dtype", "bfloat16")
            case.ints("channel_dim", 1)
            case.ints("activation", activation(act).code)
            cases.append(case)
            case = ShapeCase("dz and bias gradient %s %s" % (act, kind), "act_backward")
            case.tensor("grad_y", "bfloat16", shape, order)
            case.tensor("aux", "bfloat16", shape, order)
            case.tensor("dz", "bfloat16", shape, order)
            case.ints("activation", activation(act).code)
            case.ptr("bias_grad", 4 * shape[1])
            case.dtype("bias_grad_dtype", "float32")
            case.ints("channel_dim", 1)
            case.ints("split", 1)
            cases.append(case)
    return cases


def loader_and_logger_cases():
    cases = []
    # decode="gpu": nvJPEG's image, then one resize launch per image (a
    # 500 x 375 photo, RandomResizedCrop's full-image crop, to 224 x 224)
    case = ShapeCase("resize 500x375 -> 224x224", "resize")
    case.ptr("src", 500 * 375 * 3)
    case.ints("src_h", 375)
    case.ints("src_w", 500)
    case.ints("src_pitch", 500 * 3)
    case.ptr("dst", 224 * 224 * 3)
    case.ints("out", 224, 224)
    case.ints("placed", 0, 0, 224, 224)
    case.ints("flip", 1)
    case.floats("ry", 0.0, 375 / 224)
    case.ints("ry_span", 0, 375)
    case.floats("rx", 0.0, 500 / 224)
    case.ints("rx_span", 0, 500)
    cases.append(case)
    for side, _, batch, _ in benchmark_constant("bench_loader.py", "LOADER_CASES"):
        for nchw in (1, 0):
            case = ShapeCase("normalize %d x %dx%dx3 %s" % (batch, side, side, "nchw" if nchw else "nhwc"),
                             "normalize")
            case.ptr("src", batch * side * side * 3)
            case.ptr("dst", 2 * batch * side * side * 3)
            case.dtype("dtype", "bfloat16")
            case.ints("n", batch)
            case.ints("h", side)
            case.ints("w", side)
            case.ints("c", 3)
            case.ints("nchw", nchw)
            case.floats("scale", 1 / 0.229, 1 / 0.224, 1 / 0.225)
            case.floats("shift", -0.485 / 0.229, -0.456 / 0.224, -0.406 / 0.225)
            cases.append(case)
    # bench_logger.py: one metric per step into a LossLogger of the default size
    capacity, max_metrics = 65536, 16
    state = 8 + max_metrics * 6 * 8 + capacity * 8 + capacity * max_metrics * 4
    case = ShapeCase("logger update", "logger_update")
    case.ptr("state", state)
    case.ints("capacity", capacity)
    case.ints("max_metrics", max_metrics)
    case.ints("n", 1)
    case.ints("metric", 0)
    case.ptr("value0", 4)
    case.dtype("dtype0", "float32")
    case.ints("present", 1)
    case.ints("step", 0)
    cases.append(case)
    case = ShapeCase("logger window reset", "logger_reset")
    case.ptr("state", state)
    case.ints("max_metrics", max_metrics)
    case.ints("capacity", capacity)
    case.ints("first_step", 1)
    case.ints("nsteps", 50)  # bench_logger.py's window
    cases.append(case)
    return cases


def run_shapes(cases, directory):
    """{case name: [(kernel, grid, block, blocks run, max trips)]}."""
    dirs = []
    for k, case in enumerate(cases):
        d = os.path.join(directory, "%03d" % k)
        os.makedirs(d)
        with open(os.path.join(d, "case.txt"), "w") as f:
            f.write("\n".join(case.lines) + "\n")
        dirs.append(d)
    proc = subprocess.run([driver("plain")] + dirs, capture_output=True, text=True, timeout=1200,
                          env=tool_env(GPUACCEL_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = {}
    for case, d in zip(cases, dirs):
        status = open(os.path.join(d, "status.cuda")).read().strip()
        assert status == "ok", "%s: %s" % (case.name, status)
        launches = []
        for line in open(os.path.join(d, "launches.txt")).read().splitlines():
            kernel, *numbers = line.split()
            gx, gy, gz, bx, by, bz, ran, trips = map(int, numbers)
            launches.append((kernel, (gx, gy, gz), (bx, by, bz), ran, trips))
        assert launches, "%s launched nothing" % case.name
        out[case.name] = launches
    return out


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    cases = conv_cases() + linear_cases() + activation_cases() + loader_and_logger_cases()
    return run_shapes(cases, str(tmp_path_factory.mktemp("shapes")))


def test_every_launch_fills_an_h100_or_bounds_its_serial_work(launches):
    slow, seen = [], set()
    for name, calls in launches.items():
        for kernel, grid, block, ran, trips in calls:
            seen.add(kernel)
            blocks = grid[0] * grid[1] * grid[2]
            assert ran == min(blocks, 2), (name, kernel, grid, ran)  # sampled: the first and last block
            if blocks < MIN_BLOCKS and trips > MAX_TRIPS:
                slow.append("%s: %s grid %s x block %s: %d blocks (an H100 wants >= %d), %d loop iterations "
                            "per thread (at most %d)" % (name, kernel, grid, block, blocks, MIN_BLOCKS, trips,
                                                         MAX_TRIPS))
    assert not slow, "\n".join(slow)
    # every kernel the benchmarks can reach was seen (a new kernel joins a case here)
    expected = {"bias_act_dense_kernel", "copy_same_kernel", "conv_fwd_direct", "conv_bwd_data_direct",
                "conv_bwd_filter_direct", "gemm_generic_kernel", "normalize_kernel", "resize_kernel",
                "logger_update_kernel", "logger_reset_kernel"}
    assert expected <= seen, sorted(expected - seen)
    assert {"bgrad_tile_kernel", "bgrad_block_kernel", "bgrad_finish_kernel"} <= seen, sorted(seen)
    # every activation's cases ran (the split route's y = act(z) is the
    # dense kernel: the library's output and z are alike)
    for act in (a.label for a in ACTIVATIONS.values()):
        if act != "none":
            assert any(name.startswith("split activation %s " % act) for name in launches), act
            assert all(kernel == "bias_act_dense_kernel" for name, calls in launches.items()
                       if name.startswith("split activation") for kernel, *_ in calls)


def test_the_trip_counts_are_the_loops_own(launches):
    """The counts are the kernels' serial work as written: one grid-stride
    pass when the grid covers the problem, the problem over the grid when it
    does not (the copy's grid covers the weight: one iteration)."""
    copy = [c for name, calls in launches.items() if name.startswith("copy weight") for c in calls]
    assert copy and all(trips == 1 for _, _, _, _, trips in copy), copy
    conv = launches["conv_fwd 128x64x56x56->64 r3 nhwc"]
    (_, grid, block, _, trips), = conv
    # one output element per thread (128*64*56*56 of them fit the grid), and
    # its sum over 64 channels x 3 x 3 (a mark per channel, per filter row,
    # per filter element) for an element away from the border: 1 + 64 * (1 + 3 + 9)
    assert grid[0] * block[0] >= 128 * 64 * 56 * 56 and trips == 1 + 64 * (1 + 3 + 9), conv


# ------------------------------------------------ every loop carries the mark

LOOP = re.compile(r"\b(for|while)\s*\(")
DEVICE_FUNCTION = re.compile(r"(__global__|__device__)[^;{}]*?\)\s*(const\s*)?\{", re.S)


def matching(text, start, open_ch, close_ch):
    """The index just past the bracket that closes the one at `start`."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_ch:
            depth += 1
        elif text[i] == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
    raise AssertionError("unbalanced %s at %d" % (open_ch, start))


def statement_end(text, pos):
    """The end of the statement that starts at `pos` (after blanks): a
    block, a loop or if with its body, or up to its semicolon."""
    while text[pos].isspace():
        pos += 1
    if text[pos] == "{":
        return matching(text, pos, "{", "}")
    m = re.match(r"(for|while|if)\s*\(", text[pos:])
    if m:
        end = statement_end(text, matching(text, pos + m.end() - 1, "(", ")"))
        other = re.match(r"\s*else\b", text[end:])
        return statement_end(text, end + other.end()) if m.group(1) == "if" and other else end
    return text.index(";", pos) + 1


def loops_without_mark(path):
    """Loops in the device functions of a kernels/cuda file that neither
    carry GA_TRIP() nor have a bound fixed by the code: a `#pragma unroll`
    loop, a walk over a tensor's dims (ndim <= 32) or a tree's levels."""
    text = open(path).read()
    text = re.sub(r"/\*.*?\*/|//[^\n]*", lambda m: " " * len(m.group(0)), text, flags=re.S)
    missing = []
    for fn in DEVICE_FUNCTION.finditer(text):
        body_start = fn.end() - 1
        body = text[body_start:matching(text, body_start, "{", "}")]
        for loop in LOOP.finditer(body):
            header_end = matching(body, loop.end() - 1, "(", ")")
            header = body[loop.end():header_end - 1]
            before = body[:loop.start()].rstrip().splitlines()[-1:] or [""]
            statement = body[header_end:statement_end(body, header_end)]
            bounded = ("#pragma unroll" in before[0] or re.search(r"\bndim\b", header)
                       or re.search(r">>=\s*1|/=\s*2", header))
            if not bounded and "GA_TRIP()" not in statement:
                line = text[:body_start + loop.start()].count("\n") + 1
                missing.append("%s:%d: for/while (%s)" % (os.path.relpath(path, ROOT), line, header.strip()))
    return missing


def test_every_loop_of_the_kernels_that_can_grow_is_counted():
    files = kernel_sources() + sorted(
        os.path.join(ROOT, "kernels", "cuda", f) for f in os.listdir(os.path.join(ROOT, "kernels", "cuda"))
        if f.endswith(".cuh"))
    missing = [m for f in files for m in loops_without_mark(f)]
    assert not missing, "loops without GA_TRIP() (kernels/cuda/common.cuh):\n" + "\n".join(missing)


def test_the_mark_check_sees_a_loop_without_it(tmp_path):
    source = tmp_path / "k.cu"
    source.write_text("__global__ void k(int n, float *x)\n{\n    for (int i = threadIdx.x; i < n; i += 32)\n"
                      "        x[i] = 0;\n    for (int i = 0; i < n; i++) {\n        GA_TRIP();\n    }\n"
                      "#pragma unroll\n    for (int k = 0; k < 4; k++)\n        x[k] = 1;\n}\n")
    assert loops_without_mark(str(source)) == [
        os.path.relpath(str(source), ROOT) + ":3: for/while (int i = threadIdx.x; i < n; i += 32)"]
