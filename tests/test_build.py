"""The build: a CPU-only extension still builds, imports and works."""

import os
import subprocess
import sys
import textwrap

import pytest

from helpers import run_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_cpu_only_build(tmp_path):
    pytest.importorskip("setuptools")
    if not os.path.exists(os.path.join(ROOT, "setup.py")):
        pytest.skip("not run from a source checkout")
    env = dict(os.environ, GPUACCEL_NO_CUDA="1", GPUACCEL_SANITIZE="0")
    env.pop("LD_PRELOAD", None)  # the sanitizer CI step preloads libasan; the compiler needs none
    build = subprocess.run(
        [sys.executable, "setup.py", "build", "--build-base", str(tmp_path / "build")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    lines = [line for line in build.stdout.splitlines() if line.startswith("gpuaccel: building")]
    assert lines == ["gpuaccel: building CPU-only: GPUACCEL_NO_CUDA=1"], lines
    lib = next(p for p in (tmp_path / "build").iterdir() if p.name.startswith("lib"))
    script = textwrap.dedent(
        """
        import sys
        sys.path.insert(0, %r)
        import gpuaccel as ga
        assert ga.__file__.startswith(%r), ga.__file__
        assert not ga.built_with_cuda() and not ga.cuda_available() and ga.device_count() == 0
        assert ga.build_info()["cuda_archs"] == []
        assert ga.asarray([1.5, 2.5]).astype("int8").tolist() == [1, 2]
        for call in (lambda: ga.empty(3, device="cuda"), lambda: ga.Stream()):
            try:
                call()
            except RuntimeError as e:
                assert "built without CUDA" in str(e), e
            else:
                raise AssertionError("no error")
        print("cpu-only ok")
        """
    ) % (str(lib), str(lib))
    run = run_python("-c", script)
    assert run.returncode == 0 and "cpu-only ok" in run.stdout, run.stderr
