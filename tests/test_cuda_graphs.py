"""CUDA graphs: capture and replay of gpuaccel's ops (gpuaccel.Graph on
gpuaccel streams, and torch.cuda.graph / make_graphed_callables on a real
GPU), the calls a capture forbids, and the device's one library workspace.

On the simulator (GPUACCEL_SIM=1, kernels/sim/sim.c) a capture records the
work instead of running it and a replay reruns it with the pointers it was
captured with, each access checked against CUDA's ordering rules: memory a
graph uses that was freed or reused since, or two replays racing on one
buffer, is an ordering violation that fails the child process the scenario
runs in.  The same scenarios run on a real GPU, where the values are
checked and CUDA itself refuses what it forbids.
"""

import textwrap

import pytest

from helpers import run_python, simulated

pytestmark = pytest.mark.cuda

sim_only = pytest.mark.skipif(not simulated(), reason="needs a simulator build (GPUACCEL_SIM=1)")

PRELUDE = """
import math
import os
import numpy as np
import gpuaccel as ga

rng = np.random.default_rng(%d)
legacy = ga.Stream.from_handle(1)

erf = np.vectorize(math.erf)

def gelu(v):  # nn.GELU()'s exact form, gpuaccel's "gelu_erf"
    return 0.5 * v * (1 + erf(v / np.sqrt(2)))

def dgelu(v):
    return 0.5 * (1 + erf(v / np.sqrt(2))) + v * np.exp(-0.5 * v * v) / np.sqrt(2 * np.pi)

def conv_ref(x, w, b):
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    out = np.zeros((n, k, h - r + 1, wd - s + 1))
    for i in range(r):
        for j in range(s):
            out += np.einsum("nchw,kc->nkhw", x[:, :, i:i + h - r + 1, j:j + wd - s + 1], w[:, :, i, j])
    return out + b[None, :, None, None]

def values(*shape):
    return rng.standard_normal(shape).astype(np.float32)

def close(got, want, tol=2e-4):
    np.testing.assert_allclose(np.asarray(got.numpy() if hasattr(got, "numpy") else got, np.float64),
                               want, rtol=tol, atol=tol)

def fill(dst, host):
    # new input values, written on the legacy stream (the graph replays after it)
    dst[...] = ga.asarray(host, device="cuda")
"""


def run_child(code, rng, env=None):
    proc = run_python("-c", PRELUDE % int(rng.integers(2 ** 31)) + textwrap.dedent(code), env=env, timeout=300)
    assert proc.returncode == 0 and "ordering violation" not in proc.stderr, proc.stderr[-3000:]
    return proc.stdout.split("\n")


def test_torchs_recipe_on_gpuaccel_streams_survives_a_workspace_that_grows(rng):
    # torch.cuda.graphs' recipe: warm up on a side stream A, capture on
    # another stream B, replay; then eager calls that grow the device's
    # workspace (a conv needs more than a matmul) free the workspace the
    # warm-up used: the graph never captured it, so replays stay right
    out = run_child("""
        xv, wv, bv = values(37, 19), values(23, 19), values(23)
        x, w, b = (ga.asarray(v, device="cuda") for v in (xv, wv, bv))
        y = ga.empty((37, 23), device="cuda")
        A, B = ga.Stream(), ga.Stream()
        A.wait_stream(legacy)
        with A:
            for _ in range(3):
                ga.linear(x, w, b, activation="gelu_erf", out=y)
        before = ga.memory_stats("cuda")["workspace_bytes"]
        B.wait_stream(A)
        legacy.wait_stream(A)
        g = ga.Graph()
        g.capture_begin(B)
        with B:
            ga.linear(x, w, b, activation="gelu_erf", out=y)
        g.capture_end()
        for step in range(2):
            xs = values(37, 19)
            fill(x, xs)
            B.wait_stream(legacy)
            g.replay(B)
            legacy.wait_stream(B)
            close(y, gelu(xs.astype(np.float64) @ wv.T + bv))
            if step == 0:
                img, k, kb = values(2, 3, 9, 10), values(4, 3, 3, 3), values(4)
                with A:
                    A.wait_stream(legacy)
                    z = ga.conv2d(ga.asarray(img, device="cuda"), ga.asarray(k, device="cuda"),
                                  ga.asarray(kb, device="cuda"))
                legacy.wait_stream(A)
                close(z, conv_ref(img, k, kb))
                grown = ga.memory_stats("cuda")["workspace_bytes"]
        print("grew", grown > before > 0)
        # a conv captured on B after its warm-up on A: cuDNN plans are kept
        # per thread, so the warm-up on another stream serves the capture
        img, k, kb = values(2, 3, 9, 10), values(4, 3, 3, 3), values(4)
        xi, ki, bi = (ga.asarray(v, device="cuda") for v in (img, k, kb))
        zi = ga.empty((2, 4, 7, 8), device="cuda")
        with A:
            A.wait_stream(legacy)
            ga.conv2d(xi, ki, bi, activation="relu", out=zi)
        B.wait_stream(A)
        legacy.wait_stream(A)
        g2 = ga.Graph()
        g2.capture_begin(B)
        with B:
            ga.conv2d(xi, ki, bi, activation="relu", out=zi)
        g2.capture_end()
        img2 = values(2, 3, 9, 10)
        fill(xi, img2)
        B.wait_stream(legacy)
        g2.replay(B)
        legacy.wait_stream(B)
        close(zi, np.maximum(conv_ref(img2, k, kb), 0))
        print("one workspace", ga.memory_stats("cuda")["workspace_bytes"] == grown)
    """, rng)
    assert out[:2] == ["grew True", "one workspace True"]


def test_make_graphed_callables_order_forward_then_backward_graphs(rng):
    # torch.cuda.make_graphed_callables: warm-up of forward and backward on
    # a side stream, then the forward graph and the backward graph captured
    # one after the other on one stream (the backward reads what the forward
    # graph wrote), then each step replays them in that order
    out = run_child("""
        N, K, M = 29, 19, 13
        wv, bv = values(M, K), values(M)
        x, w, b = ga.asarray(values(N, K), device="cuda"), ga.asarray(wv, device="cuda"), ga.asarray(bv, device="cuda")
        gy = ga.asarray(values(N, M), device="cuda")
        y, z = ga.empty((N, M), device="cuda"), ga.empty((N, M), device="cuda")
        gx, gw, gb = ga.empty((N, K), device="cuda"), ga.empty((M, K), device="cuda"), ga.empty((M,), device="cuda")

        def forward():
            ga.linear(x, w, b, activation="gelu_erf", out=y, save_preactivation=True, preactivation_out=z)

        def backward():
            ga.linear_backward(gy, x, w, activation="gelu_erf", preactivation=z, out=(gx, gw, gb))

        side, capture = ga.Stream(), ga.Stream()
        side.wait_stream(legacy)
        with side:
            for _ in range(3):
                forward()
                backward()
        capture.wait_stream(side)
        legacy.wait_stream(side)
        fwd, bwd = ga.Graph(), ga.Graph()
        fwd.capture_begin(capture)
        with capture:
            forward()
        fwd.capture_end()
        bwd.capture_begin(capture)
        with capture:
            backward()
        bwd.capture_end()
        run = ga.Stream()
        for step in range(3):
            xs, gys = values(N, K), values(N, M)
            fill(x, xs)
            fill(gy, gys)
            run.wait_stream(legacy)
            fwd.replay(run)
            bwd.replay(run)
            legacy.wait_stream(run)
            pre = xs.astype(np.float64) @ wv.T + bv
            dz = gys * dgelu(pre)
            close(y, gelu(pre))
            close(gx, dz @ wv, 1e-3)
            close(gw, dz.T @ xs, 1e-3)
            close(gb, dz.sum(0), 1e-3)
        print("ok")
    """, rng)
    assert out[0] == "ok"


def test_two_graphs_captured_on_one_stream_replay_at_once(rng):
    # torch.cuda.graph captures every graph on one stream of its own; two of
    # them replayed on two streams at once must not share scratch memory
    out = run_child("""
        capture = ga.Stream()
        capture.wait_stream(legacy)
        graphs, checks, inputs = [], [], []
        for g in range(2):
            xv, wv = values(31, 17), values(11, 17)
            img, k = values(1, 2, 8, 9), values(3, 2, 3, 3)
            x, w = ga.asarray(xv, device="cuda"), ga.asarray(wv, device="cuda")
            xi, ki = ga.asarray(img, device="cuda"), ga.asarray(k, device="cuda")
            y, zi = ga.empty((31, 11), device="cuda"), ga.empty((1, 3, 6, 7), device="cuda")
            with capture:  # the warm-up, eagerly
                ga.linear(x, w, activation="relu", out=y)
                ga.conv2d(xi, ki, out=zi)
            graph = ga.Graph()
            graph.capture_begin(capture)
            with capture:
                ga.linear(x, w, activation="relu", out=y)
                ga.conv2d(xi, ki, out=zi)
            graph.capture_end()
            graphs.append(graph)
            inputs.append((x, w, xi, ki))   # a graph's inputs live as long as it replays
            checks.append((y, zi, np.maximum(xv.astype(np.float64) @ wv.T, 0),
                           conv_ref(img, k, np.zeros(3))))
        s1, s2 = ga.Stream(), ga.Stream()
        s1.wait_stream(capture)
        s2.wait_stream(capture)
        for _ in range(3):
            graphs[0].replay(s1)
            graphs[1].replay(s2)   # not ordered after s1's replay
        legacy.wait_stream(s1)
        legacy.wait_stream(s2)
        for y, zi, y_ref, z_ref in checks:
            close(y, y_ref)
            close(zi, z_ref)
        print("ok")
    """, rng)
    assert out[0] == "ok"


def test_arrays_inside_a_capture(rng):
    # gpuaccel Arrays made on other streams are used inside a capture
    # without waits across its boundary; memory freed on the captured
    # stream waits for the capture's end; arrays the captured ops return
    # are the graph's memory, remade by each replay at the same address
    out = run_child("""
        A, B = ga.Stream(), ga.Stream()
        wv = values(9, 14)
        with A:
            x = ga.asarray(values(21, 14), device="cuda")
            w = ga.asarray(wv, device="cuda")
        with B:
            doomed = ga.zeros((1000,), device="cuda")
        B.wait_stream(A)
        legacy.wait_stream(A)
        with B:
            ga.linear(x, w)   # the warm-up
        legacy.wait_stream(B)
        allocated = ga.memory_stats("cuda")["allocated_bytes"]
        g = ga.Graph()
        g.capture_begin(B)
        with B:
            y = ga.linear(x, w, activation="relu")
            del doomed   # made eagerly on B: freed once the capture is over
            pinned = ga.empty((64,), pinned=True)   # the allocator's own calls leave the capture alone
        g.capture_end()
        print("freed after the capture", ga.memory_stats("cuda")["allocated_bytes"] < allocated + y.nbytes)
        for _ in range(2):
            xs = values(21, 14)
            fill(x, xs)
            B.wait_stream(legacy)
            g.replay(B)
            legacy.wait_stream(B)
            close(y, np.maximum(xs.astype(np.float64) @ wv.T, 0))
        print("ok", pinned.shape)
    """, rng)
    assert out[:2] == ["freed after the capture True", "ok (64,)"]


@sim_only
def test_a_conv_without_a_plan_is_refused_before_its_search(rng, tmp_path):
    # a capturing conv needs the plan its thread made eagerly: without one
    # it fails before anything reaches the stream (the capture stays valid)
    # and before any search, so the eager warm-up after it is the call that
    # searches (a miss, not a hit) and the capture after that runs the plan
    out = run_child("""
        img, k, kb = values(2, 3, 9, 10), values(4, 3, 3, 3), values(4)
        xi, ki, bi = (ga.asarray(v, device="cuda") for v in (img, k, kb))
        zi = ga.empty((2, 4, 7, 8), device="cuda")
        B = ga.Stream()
        B.wait_stream(legacy)
        g = ga.Graph()
        g.capture_begin(B)
        with B:
            try:
                ga.conv2d(xi, ki, bi, out=zi)
            except ga.CudaError as e:
                print("refused", e.name, "eagerly on this thread" in str(e))
        g.capture_end()
        print("capture ended")
        stats = ga.conv_stats()
        print("cache", stats["plan_cache_hits"], stats["plan_cache_misses"])
        with B:
            ga.conv2d(xi, ki, bi, out=zi)   # the warm-up
        legacy.wait_stream(B)
        stats = ga.conv_stats()
        print("cache", stats["plan_cache_hits"], stats["plan_cache_misses"])
        g2 = ga.Graph()
        g2.capture_begin(B)
        with B:
            ga.conv2d(xi, ki, bi, out=zi)
        g2.capture_end()
        img2 = values(2, 3, 9, 10)
        fill(xi, img2)
        B.wait_stream(legacy)
        g2.replay(B)
        legacy.wait_stream(B)
        close(zi, conv_ref(img2, k, kb))
        stats = ga.conv_stats()
        print("cache", stats["plan_cache_hits"], stats["plan_cache_misses"])
    """, rng, env={"GPUACCEL_CACHE_DIR": str(tmp_path)})
    assert out[:5] == ["refused cudaErrorStreamCaptureUnsupported True", "capture ended", "cache 0 1",
                       "cache 0 2", "cache 1 2"]


ILLEGAL = {
    # what a capture forbids: the call fails with CUDA's error, and the
    # capture is invalidated (capture_end fails)
    "stream synchronize": ("B.synchronize()", "cudaErrorStreamCaptureUnsupported"),
    "device synchronize": ("ga.synchronize()", "cudaErrorStreamCaptureUnsupported"),
    "query of an event": ("before.query()", "cudaErrorStreamCaptureUnsupported"),
    "wait on an event recorded outside": ("before.wait(B)", "cudaErrorStreamCaptureIsolation"),
}


@pytest.mark.parametrize("what", sorted(ILLEGAL))
def test_what_a_capture_forbids_fails_as_cuda_fails_it(rng, what):
    call, name = ILLEGAL[what]
    out = run_child("""
        A, B = ga.Stream(), ga.Stream()
        before = ga.Event()
        with A:
            ga.zeros((8,), device="cuda")
        before.record(A)
        g = ga.Graph()
        g.capture_begin(B)
        try:
            %s
        except ga.CudaError as e:
            print("refused", e.name)
        else:
            print("ran")
        try:
            g.capture_end()
        except ga.CudaError as e:
            print("capture", e.name)
        else:
            print("capture ended")
        # the streams work again after the failed capture
        with B:
            print(float(ga.ones((4,), device="cuda").numpy().sum()))
    """ % call, rng)
    assert out[:3] == ["refused " + name, "capture cudaErrorStreamCaptureInvalidated", "4.0"]


def test_the_legacy_stream_is_refused_while_a_blocking_stream_is_captured(rng):
    out = run_child("""
        per_thread = ga.Stream.from_handle(2)
        g = ga.Graph()
        g.capture_begin(per_thread)
        try:
            ga.Event().record(legacy)   # queued on the legacy default stream
        except ga.CudaError as e:
            print("refused", e.name)
        try:
            g.capture_end()
        except ga.CudaError as e:
            print("capture", e.name)
        try:
            ga.Graph().capture_begin(legacy)
        except ValueError as e:
            print("legacy", "legacy default stream cannot be captured" in str(e))
    """, rng)
    assert out[:3] == ["refused cudaErrorStreamCaptureImplicit", "capture cudaErrorStreamCaptureInvalidated",
                       "legacy True"]


def test_a_copy_staged_through_host_memory_is_refused_in_a_capture(rng):
    out = run_child("""
        B = ga.Stream()
        g = ga.Graph()
        g.capture_begin(B)
        try:
            ga.asarray(np.ones(5, np.float32), device="cuda", stream=B)
        except RuntimeError as e:
            print("refused", "cannot be captured" in str(e))
        g.capture_end()   # nothing illegal reached CUDA
        g.replay(B)
        print("ok")
    """, rng)
    assert out[:2] == ["refused True", "ok"]


def test_one_workspace_per_device_shared_by_streams_in_order(rng):
    # calls on two streams with no order between them share the device's
    # workspace: each waits for the last call that used it
    out = run_child("""
        streams = [ga.Stream() for _ in range(3)]
        data = []
        for s in streams:
            s.wait_stream(legacy)
            xv, wv = values(17, 12), values(8, 12)
            data.append((xv, wv, ga.asarray(xv, device="cuda"), ga.asarray(wv, device="cuda")))
        for s in streams:
            s.wait_stream(legacy)
        results = []
        for rounds in range(3):
            for s, (xv, wv, x, w) in zip(streams, data):
                with s:
                    results.append((ga.linear(x, w), xv @ wv.T))
                if not rounds and s is streams[0]:
                    first = ga.memory_stats("cuda")["workspace_bytes"]
        for s in streams:
            legacy.wait_stream(s)
        for got, want in results:
            close(got, want.astype(np.float64))
        print("one", ga.memory_stats("cuda")["workspace_bytes"] == first > 0)
    """, rng)
    assert out[0] == "one True"


@sim_only
def test_a_replay_of_memory_freed_since_the_capture_is_reported(rng):
    # the simulator's side of the contract: a graph replays its pointers,
    # so memory it captured and that was freed since is a use after free
    proc = run_python("-c", PRELUDE % int(rng.integers(2 ** 31)) + textwrap.dedent("""
        B = ga.Stream()
        x, w = ga.asarray(values(6, 5), device="cuda"), ga.asarray(values(4, 5), device="cuda")
        y = ga.empty((6, 4), device="cuda")
        B.wait_stream(legacy)
        with B:
            ga.linear(x, w, out=y)
        g = ga.Graph()
        g.capture_begin(B)
        with B:
            ga.linear(x, w, out=y)
        g.capture_end()
        legacy.wait_stream(B)
        del x
        try:
            g.replay(B)
        except ValueError as e:
            print("refused", "use of freed memory" in str(e))
    """), timeout=300)
    assert proc.stdout.split("\n")[0] == "refused True", proc.stderr[-3000:]


@sim_only
def test_an_array_a_graph_allocates_exists_between_its_replays_only(rng):
    proc = run_python("-c", PRELUDE % int(rng.integers(2 ** 31)) + textwrap.dedent("""
        B = ga.Stream()
        xv, wv = values(6, 5), values(4, 5)
        x, w = ga.asarray(xv, device="cuda"), ga.asarray(wv, device="cuda")
        B.wait_stream(legacy)
        g = ga.Graph()
        g.capture_begin(B)
        with B:
            y = ga.linear(x, w)
        g.capture_end()
        try:
            y.to("cpu", stream=B)
        except ValueError as e:
            print("before a replay", "not allocated" in str(e))
        g.replay(B)
        print("after", np.allclose(y.to("cpu", stream=B).numpy(), xv @ wv.T, atol=1e-5))
    """), timeout=300)
    assert proc.stdout.split("\n")[:2] == ["before a replay True", "after True"], proc.stderr[-3000:]


@sim_only
def test_a_conv_captured_on_a_thread_without_its_plan_is_refused_before_any_setup(rng):
    out = run_child("""
        import threading
        img, k = ga.asarray(values(1, 2, 6, 6), device="cuda"), ga.asarray(values(3, 2, 3, 3), device="cuda")
        ga.conv2d(img, k)   # this thread's plan
        result = []
        def other():
            B = ga.Stream()
            g = ga.Graph()
            g.capture_begin(B)
            try:
                ga.conv2d(img, k, stream=B)
            except ga.CudaError as e:
                result.append(e.name)
            g.capture_end()   # refused before touching the stream: the capture is fine
            result.append("ended")
        t = threading.Thread(target=other)
        t.start()
        t.join()
        print(*result)
    """, rng)
    assert out[0] == "cudaErrorStreamCaptureUnsupported ended"


@sim_only
def test_a_failed_event_query_never_reuses_a_pinned_buffer(rng):
    # a pinned block whose copy was not seen finished is not handed out
    # again when the query of its event fails (the simulator fails the
    # reuse of a buffer a copy may still read)
    out = run_child("""
        src = ga.empty((4096,), dtype="float32", pinned=True)
        src[...] = 1.0
        s = ga.Stream()
        ptr = src.data_ptr
        copy = src.to("cuda", stream=s)   # an async copy that reads src on s
        del src   # back to the pinned pool, with the copy's event
        os.environ["GPUACCEL_SIM_EVENT_QUERY_FAILS"] = "1"
        again = ga.empty((4096,), dtype="float32", pinned=True)
        print("reused", again.data_ptr == ptr)
        os.environ["GPUACCEL_SIM_EVENT_QUERY_FAILS"] = "0"
        s.synchronize()
        print(float(copy.numpy().sum()))
    """, rng)
    assert out[:2] == ["reused False", "4096.0"]


# ------------------------------------------------------------ a real GPU

@pytest.mark.gpu
@pytest.mark.parametrize("layer", ["linear", "conv"])
def test_torch_cuda_graph_replays_fused_layers_forward_and_backward(layer):
    torch = pytest.importorskip("torch")
    import gpuaccel.torch as gt

    torch.manual_seed(0)
    if layer == "linear":
        model = gt.FusedLinear(48, 40, activation="gelu").cuda()
        static_x = torch.randn(24, 48, device="cuda", requires_grad=True)
    else:
        model = gt.FusedConv2d(3, 8, 3, padding=1, activation="relu").cuda()
        static_x = torch.randn(4, 3, 11, 13, device="cuda", requires_grad=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            model(static_x).square().sum().backward()
    torch.cuda.current_stream().wait_stream(side)
    model.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = model(static_x).square().sum()
        static_loss.backward()
    for _ in range(2):
        new_x = torch.randn_like(static_x)
        with torch.no_grad():
            static_x.copy_(new_x)
        graph.replay()
        reference = model(new_x.detach().requires_grad_()).square().sum()
        grads = torch.autograd.grad(reference, [p for p in model.parameters()])
        torch.testing.assert_close(static_loss, reference, rtol=1e-4, atol=1e-3)
        for p, g in zip(model.parameters(), grads):
            torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
def test_make_graphed_callables_with_fused_layers():
    torch = pytest.importorskip("torch")
    import gpuaccel.torch as gt

    torch.manual_seed(0)
    model = torch.nn.Sequential(gt.FusedConv2d(3, 6, 3, activation="relu"), torch.nn.Flatten(),
                                gt.FusedLinear(6 * 7 * 9, 10, activation="gelu")).cuda()
    eager = torch.nn.Sequential(*[m for m in model]).cuda()
    x = torch.randn(5, 3, 9, 11, device="cuda", requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(model, (x,))
    for _ in range(3):
        data = torch.randn_like(x).requires_grad_()
        out = graphed(data)
        out.square().sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        data_grad = data.grad.clone()
        model.zero_grad(set_to_none=True)
        ref_in = data.detach().requires_grad_()
        ref = eager(ref_in)
        ref.square().sum().backward()
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-3)
        torch.testing.assert_close(data_grad, ref_in.grad, rtol=1e-4, atol=1e-3)
        for g, p in zip(grads, eager.parameters()):
            torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-3)
        model.zero_grad(set_to_none=True)
