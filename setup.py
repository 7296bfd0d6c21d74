"""Build of gpuaccel's C extension (gpuaccel._C).

The C sources (csrc/, kernels/, kernels/cpu/) are compiled with the
platform's C compiler; kernels/cuda/*.cu with nvcc, found through CUDA_HOME
(or CUDA_PATH), then PATH, then /usr/local/cuda.  Without nvcc, without
cuBLASLt or cuDNN, or with GPUACCEL_NO_CUDA=1, the extension is built
CPU-only and the build says so in one line.

Environment:
  GPUACCEL_CUDA_ARCH   architectures, e.g. "80;86;89;90" (default) or "90a";
                       PTX is embedded for the newest
  GPUACCEL_NO_CUDA=1   build without CUDA
  GPUACCEL_SANITIZE=1  build the C code with AddressSanitizer + UBSan
  GPUACCEL_SIM=1       test build: no CUDA, a simulated runtime that checks
                       stream ordering instead (kernels/sim), whose kernels
                       are kernels/cuda's own, compiled by the host C++
                       compiler (CXX, else g++) through kernels/cudacpu; it
                       needs the CUDA toolkit's headers (CUDA_HOME), not nvcc
  GPUACCEL_JOBS        parallel compile jobs (default: the CPU count)
  GPUACCEL_NO_JPEG=1   build without libjpeg-turbo (the image loader then
                       says what to install); JPEG_HOME where it is, when
                       not in the compiler's default folders
  CUDNN_HOME           where cuDNN is, when not beside the CUDA toolkit
"""

import glob
import os
import shutil
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor

import numpy
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
DEFAULT_ARCHS = "80;86;89;90"


def _rel(*parts):
    return os.path.join(*parts)


C_SOURCES = sorted(
    glob.glob(_rel("csrc", "*.c")) + glob.glob(_rel("kernels", "*.c")) + glob.glob(_rel("kernels", "cpu", "*.c"))
)
CU_SOURCES = sorted(glob.glob(_rel("kernels", "cuda", "*.cu")))
# The simulator build runs the files of kernels/cuda that define kernels
# on the CPU (kernels/cudacpu); the others call cuBLASLt, cuDNN or the
# CUDA runtime, which kernels/sim/sim.c stands in for.
SIM_CU_SOURCES = [s for s in CU_SOURCES if "__global__" in open(os.path.join(ROOT, s)).read()]
CUDACPU_SOURCES = [_rel("kernels", "cudacpu", "fiber.cpp"), _rel("kernels", "cudacpu", "cudart.cpp")]
HEADERS = sorted(
    glob.glob(_rel("csrc", "*.h")) + glob.glob(_rel("kernels", "*.h")) + glob.glob(_rel("kernels", "*", "*.h"))
    + glob.glob(_rel("kernels", "cuda", "*.cuh"))
)


def _say(msg):
    print("gpuaccel: " + msg, flush=True)


def _site_dirs():
    """Where pip-installed NVIDIA wheels may live (the target environment too)."""
    dirs = []
    for key in ("purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.append(path)
    dirs.extend(p for p in sys.path if p and os.path.isdir(p))
    seen, out = set(), []
    for d in dirs:
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


def _find_nvcc():
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home and os.path.isfile(os.path.join(home, "bin", "nvcc")):
            return os.path.join(home, "bin", "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    if os.path.isfile("/usr/local/cuda/bin/nvcc"):
        return "/usr/local/cuda/bin/nvcc"
    return None


def _cuda_headers():
    """The CUDA toolkit's include folder with the runtime API and the host
    implementations of the half types, for the simulator build."""
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = _find_nvcc()
    if nvcc:
        homes.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    dirs = [os.path.join(h, "include") for h in homes if h]
    dirs += [os.path.join(s, "nvidia", "cu13", "include") for s in _site_dirs()]
    for d in dirs:
        if all(os.path.exists(os.path.join(d, h)) for h in ("cuda_runtime.h", "cuda_fp16.h", "cuda_bf16.h")):
            return d
    return None


def _sim_cxx_jobs(cflags):
    """(source, command) for the simulator build's C++: kernels/cuda's
    files with kernels, through kernels/cudacpu with their entry points
    renamed for kernels/sim/sim.c (kernels/sim/kernel_names.h), and the
    layer itself."""
    cxx = os.environ.get("CXX") or shutil.which("g++")
    cuda_headers = _cuda_headers()
    if not cxx or not cuda_headers:
        raise RuntimeError(
            "GPUACCEL_SIM=1 compiles kernels/cuda with the host C++ compiler through kernels/cudacpu: "
            "it needs g++ (or CXX) and the CUDA toolkit's headers (cuda_runtime.h, cuda_fp16.h, "
            "cuda_bf16.h; set CUDA_HOME), and found %s" % ("no C++ compiler" if not cxx else "no CUDA headers"))
    _say("simulator: kernels/cuda runs on the CPU through kernels/cudacpu (%s)" % cxx)
    flags = [f for f in cflags if f != "-std=c11"] + [
        "-std=c++17", "-fPIC", "-Wno-unknown-pragmas", "-I" + ROOT, "-I" + cuda_headers]
    through_layer = ["-include", os.path.join(ROOT, "kernels", "cudacpu", "cudacpu.h"),
                     "-include", os.path.join(ROOT, "kernels", "sim", "kernel_names.h"), "-x", "c++"]
    return [(src, [cxx] + flags + through_layer) for src in SIM_CU_SOURCES] + [
        (src, [cxx] + flags) for src in CUDACPU_SOURCES]


def _find_file(dirs, patterns):
    for d in dirs:
        for pattern in patterns:
            hits = sorted(glob.glob(os.path.join(d, pattern)))
            if hits:
                return hits[0]
    return None


def _link_flag(path):
    """-lNAME when the unversioned libNAME.so exists, else -l:libNAME.so.N."""
    base = os.path.basename(path)
    name = base[3:].split(".so")[0]
    if os.path.exists(os.path.join(os.path.dirname(path), "lib%s.so" % name)):
        return "-l" + name
    return "-l:" + base


def _soname(path):
    base = os.path.basename(os.path.realpath(path)) if path.endswith(".so") else os.path.basename(path)
    try:
        out = subprocess.run(["objdump", "-p", path], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if "SONAME" in line:
                return line.split()[-1]
    except OSError:
        pass
    return base


class CudaConfig:
    """What a CUDA build needs, or why there will be none."""

    def __init__(self):
        self.reason = None
        if os.environ.get("GPUACCEL_NO_CUDA") == "1":
            self.reason = "GPUACCEL_NO_CUDA=1"
            return
        if os.environ.get("GPUACCEL_SIM") == "1":
            self.reason = "GPUACCEL_SIM=1 (simulated CUDA runtime, a test build)"
            return
        self.nvcc = _find_nvcc()
        if not self.nvcc:
            self.reason = "no nvcc found (set CUDA_HOME or put nvcc on PATH)"
            return
        root = os.path.dirname(os.path.dirname(os.path.realpath(self.nvcc)))
        self.root = root
        toolkit_inc = [os.path.join(root, "include"), os.path.join(root, "targets", "x86_64-linux", "include")]
        toolkit_lib = [
            os.path.join(root, "lib64"),
            os.path.join(root, "lib"),
            os.path.join(root, "targets", "x86_64-linux", "lib"),
        ]
        wheels = _site_dirs()
        wheel_cuda_inc = [os.path.join(s, "nvidia", sub, "include") for s in wheels for sub in ("cu13", "cublas")]
        wheel_cuda_lib = [os.path.join(s, "nvidia", sub, "lib") for s in wheels for sub in ("cu13", "cublas")]
        cudnn_home = os.environ.get("CUDNN_HOME")
        cudnn_inc = ([os.path.join(cudnn_home, "include")] if cudnn_home else []) + toolkit_inc + [
            "/usr/include",
            "/usr/include/x86_64-linux-gnu",
        ] + [os.path.join(s, "nvidia", "cudnn", "include") for s in wheels]
        cudnn_lib = (
            [os.path.join(cudnn_home, d) for d in ("lib64", "lib")] if cudnn_home else []
        ) + toolkit_lib + ["/usr/lib/x86_64-linux-gnu"] + [os.path.join(s, "nvidia", "cudnn", "lib") for s in wheels]

        self.cudart_static = _find_file(toolkit_lib + wheel_cuda_lib, ["libcudart_static.a"])
        cublaslt_h = _find_file(toolkit_inc + wheel_cuda_inc, ["cublasLt.h"])
        self.cublaslt = _find_file(toolkit_lib + wheel_cuda_lib, ["libcublasLt.so", "libcublasLt.so.[0-9]*"])
        cudnn_h = _find_file(cudnn_inc, ["cudnn.h"])
        self.cudnn = _find_file(cudnn_lib, ["libcudnn.so", "libcudnn.so.[0-9]*"])
        missing = [
            name
            for name, found in (
                ("libcudart_static.a", self.cudart_static),
                ("cublasLt.h", cublaslt_h),
                ("libcublasLt.so", self.cublaslt),
                ("cudnn.h", cudnn_h),
                ("libcudnn.so", self.cudnn),
            )
            if not found
        ]
        if missing:
            self.reason = "nvcc found at %s, but not %s (set CUDNN_HOME for cuDNN)" % (self.nvcc, ", ".join(missing))
            return
        self.include_dirs = sorted({os.path.dirname(cublaslt_h), os.path.dirname(cudnn_h)}, key=len)
        self.include_dirs.append(toolkit_inc[0])
        # nvJPEG for the image loader's decode="gpu": optional within a CUDA build; its header
        # is needed here, its library only at run time (loaded by kernels/cuda/jpeg.cu)
        nvjpeg_home = os.environ.get("NVJPEG_HOME")
        nvjpeg_inc = ([os.path.join(nvjpeg_home, "include")] if nvjpeg_home else []) + toolkit_inc + [
            os.path.join(s, "nvidia", "cu13", "include") for s in wheels]
        nvjpeg_lib = ([os.path.join(nvjpeg_home, d) for d in ("lib", "lib64")] if nvjpeg_home else []) + \
            toolkit_lib + [os.path.join(s, "nvidia", "cu13", "lib") for s in wheels]
        nvjpeg_h = _find_file(nvjpeg_inc, ["nvjpeg.h"])
        self.nvjpeg = _find_file(nvjpeg_lib, ["libnvjpeg.so", "libnvjpeg.so.[0-9]*"]) if nvjpeg_h else None
        self.nvjpeg_note = "" if self.nvjpeg else (
            "no %s found: pip install nvidia-nvjpeg (or set NVJPEG_HOME) and rebuild"
            % ("nvjpeg.h" if not nvjpeg_h else "libnvjpeg.so"))
        if self.nvjpeg and os.path.dirname(nvjpeg_h) not in self.include_dirs:
            self.include_dirs.append(os.path.dirname(nvjpeg_h))
        self.lib_dirs = []
        for path in (self.cudart_static, self.cublaslt, self.cudnn):
            d = os.path.dirname(path)
            if d not in self.lib_dirs:
                self.lib_dirs.append(d)
        # Prefer the NVIDIA wheels' copies at run time (the ones torch loads),
        # then the folders found now.
        self.rpath = ["$ORIGIN/../nvidia/cu13/lib", "$ORIGIN/../nvidia/cudnn/lib"] + self.lib_dirs
        self.sonames = [_soname(self.cublaslt), _soname(self.cudnn)] + ([_soname(self.nvjpeg)] if self.nvjpeg else [])
        arch_text = os.environ.get("GPUACCEL_CUDA_ARCH", DEFAULT_ARCHS)
        self.archs = [a.strip() for a in arch_text.replace(",", ";").split(";") if a.strip()]
        if not self.archs:
            self.reason = "GPUACCEL_CUDA_ARCH is empty"

    @property
    def enabled(self):
        return self.reason is None

    def gencode_flags(self):
        flags = []
        for arch in self.archs:
            flags += ["-gencode", "arch=compute_%s,code=sm_%s" % (arch, arch)]
        newest = max(self.archs, key=lambda a: int("".join(ch for ch in a if ch.isdigit())))
        flags += ["-gencode", "arch=compute_%s,code=compute_%s" % (newest, newest)]
        return flags


class JpegConfig:
    """libjpeg-turbo for the image loader's CPU decoder (kernels/cpu/jpeg.c):
    jpeglib.h with jpeg_crop_scanline (libjpeg-turbo >= 1.5), and libjpeg."""

    INSTALL = ("apt-get install libjpeg62-turbo-dev (Debian; Ubuntu: libjpeg-turbo8-dev, Fedora: "
               "libjpeg-turbo-devel), or set JPEG_HOME")

    def __init__(self):
        self.reason, self.include_dirs, self.lib_dirs = None, [], []
        if os.environ.get("GPUACCEL_NO_JPEG") == "1":
            self.reason = "GPUACCEL_NO_JPEG=1"
            return
        home = os.environ.get("JPEG_HOME")
        inc = ([os.path.join(home, "include")] if home else []) + [
            "/usr/include", "/usr/local/include", "/opt/libjpeg-turbo/include"]
        lib = ([os.path.join(home, d) for d in ("lib64", "lib")] if home else []) + [
            "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib",
            "/opt/libjpeg-turbo/lib64"]
        header = _find_file(inc, ["jpeglib.h"])
        library = _find_file(lib, ["libjpeg.so", "libjpeg.so.[0-9]*"])
        if not header or not library:
            self.reason = "no libjpeg-turbo found (%s missing): %s" % (
                "jpeglib.h" if not header else "libjpeg.so", self.INSTALL)
            return
        if "jpeg_crop_scanline" not in open(header, errors="replace").read():
            self.reason = "%s is not libjpeg-turbo >= 1.5 (no jpeg_crop_scanline): %s" % (header, self.INSTALL)
            return
        self.library = library
        if os.path.dirname(header) not in ("/usr/include", "/usr/local/include"):
            self.include_dirs = [os.path.dirname(header)]
        self.lib_dirs = [os.path.dirname(library)]

    @property
    def enabled(self):
        return self.reason is None


class BuildExt(build_ext):
    def build_extension(self, ext):
        cuda = CudaConfig()
        sanitize = os.environ.get("GPUACCEL_SANITIZE") == "1"
        jobs = int(os.environ.get("GPUACCEL_JOBS", "0")) or os.cpu_count() or 1
        if cuda.enabled:
            _say("building with CUDA (nvcc %s, architectures %s)" % (cuda.nvcc, ";".join(cuda.archs)))
            _say("JPEG decoding on the GPU: nvJPEG (%s)" % cuda.nvjpeg if cuda.nvjpeg
                 else "building without GPU JPEG decoding: %s" % cuda.nvjpeg_note)
        else:
            _say("building CPU-only: %s" % cuda.reason)
        jpeg = JpegConfig()
        _say("JPEG decoding on the CPU: libjpeg-turbo (%s)" % jpeg.library if jpeg.enabled
             else "building without JPEG decoding: %s" % jpeg.reason)

        sim = not cuda.enabled and os.environ.get("GPUACCEL_SIM") == "1"
        c_sources = list(ext.sources)
        if not cuda.enabled:  # the ga_cuda_* entry points: simulated, or "built without CUDA"
            c_sources.append(_rel("kernels", "sim", "sim.c") if sim else _rel("kernels", "nocuda", "nocuda.c"))
        include_dirs = [ROOT, numpy.get_include()] + list(ext.include_dirs)
        cflags = ["-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers",
                  "-fvisibility=hidden", "-pthread"]
        ldflags = ["-pthread"]
        if sanitize:
            cflags += ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
                       "-fno-sanitize-recover=undefined"]
            ldflags += ["-fsanitize=address,undefined"]
            _say("sanitizer build (AddressSanitizer + UndefinedBehaviorSanitizer)")
        else:
            cflags += ["-O3"]
        macros = [("GPUACCEL_WITH_CUDA", "1")] if cuda.enabled else []
        if jpeg.enabled:
            macros.append(("GPUACCEL_WITH_JPEG", "1"))
            include_dirs += jpeg.include_dirs

        build_temp = os.path.abspath(self.build_temp)
        os.makedirs(build_temp, exist_ok=True)
        depends = [os.path.join(ROOT, h) for h in HEADERS]

        # kernels/sim/sim.c opens real NVTX ranges: the CUDA toolkit's header-only library
        # (without them, _sim_cxx_jobs below says what is missing)
        sim_c_include_dirs = [d for d in [_cuda_headers()] if d] if sim else []

        def compile_c(src):
            extra_dirs = sim_c_include_dirs if src.endswith("sim.c") else []
            return self.compiler.compile(
                [src], output_dir=build_temp, macros=macros, include_dirs=include_dirs + extra_dirs,
                extra_postargs=cflags, depends=depends,
            )[0]

        def stale(src, obj):
            return self.force or not os.path.exists(obj) or any(
                os.path.getmtime(f) > os.path.getmtime(obj) for f in [src] + depends)

        def compile_cu(src):
            obj = os.path.join(build_temp, src.replace(os.sep, "_") + ".o")
            cmd = [cuda.nvcc, "-c", src, "-o", obj, "-std=c++17", "-O3", "-lineinfo",
                   "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden",
                   '-DGPUACCEL_CUDA_ARCHS="%s"' % ";".join(cuda.archs)]
            if cuda.nvjpeg:
                cmd.append("-DGPUACCEL_WITH_NVJPEG=1")
            cmd += ["-I" + ROOT] + ["-I" + d for d in cuda.include_dirs] + cuda.gencode_flags()
            if stale(src, obj):
                _say("nvcc " + src)
                subprocess.run(cmd, check=True, cwd=ROOT)
            return obj

        cxx_jobs = _sim_cxx_jobs(cflags) if sim else []

        def compile_cxx(job):
            src, cmd = job
            obj = os.path.join(build_temp, src.replace(os.sep, "_") + ".o")
            if stale(src, obj):
                subprocess.run(cmd + ["-c", src, "-o", obj], check=True, cwd=ROOT)
            return obj

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            # the slow nvcc (or C++) jobs first, so both cores stay busy
            futures = [pool.submit(compile_cu, s) for s in (CU_SOURCES if cuda.enabled else [])]
            futures += [pool.submit(compile_cxx, j) for j in cxx_jobs]
            futures += [pool.submit(compile_c, s) for s in c_sources]
            objects = [f.result() for f in futures]

        libraries, library_dirs, link_args = [], [], list(ldflags)
        if cuda.enabled:
            library_dirs = cuda.lib_dirs
            link_args += [cuda.cudart_static, _link_flag(cuda.cublaslt), _link_flag(cuda.cudnn)]
            link_args += ["-lstdc++", "-lrt", "-ldl", "-Wl,--enable-new-dtags"]
            link_args += ["-Wl,-rpath," + d for d in cuda.rpath]
        if cxx_jobs:
            link_args += ["-lstdc++"]
        if jpeg.enabled:
            library_dirs = list(library_dirs) + [d for d in jpeg.lib_dirs if d not in library_dirs]
            link_args += [_link_flag(jpeg.library)]
        ext_path = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(ext_path), exist_ok=True)
        self.compiler.link_shared_object(
            objects, ext_path, libraries=libraries, library_dirs=library_dirs,
            extra_postargs=link_args, target_lang="c",
        )
        self._write_build_config(ext_path, cuda, sanitize, jpeg)

    def copy_extensions_to_source(self):
        super().copy_extensions_to_source()
        # in-place and editable builds: the generated module goes along
        built = os.path.join(self.build_lib, "gpuaccel", "_build_config.py")
        if os.path.exists(built):
            shutil.copyfile(built, os.path.join(ROOT, "gpuaccel", "_build_config.py"))

    def _write_build_config(self, ext_path, cuda, sanitize, jpeg):
        """gpuaccel/_build_config.py: what the Python side needs to know
        before it loads the extension (which CUDA libraries to preload)."""
        text = (
            "# Written by setup.py at build time.\n"
            "BUILT_WITH_CUDA = %r\n"
            "CUDA_BUILD_NOTE = %r\n"
            "CUDA_LIBRARY_SONAMES = %r\n"
            "SANITIZE = %r\n"
            "JPEG_BUILD_NOTE = %r\n"
            "NVJPEG_BUILD_NOTE = %r\n"
        ) % (cuda.enabled, cuda.reason or "", cuda.sonames if cuda.enabled else [], sanitize, jpeg.reason or "",
             (cuda.nvjpeg_note if cuda.enabled else "no CUDA build (%s)" % cuda.reason))
        path = os.path.join(os.path.dirname(ext_path), "_build_config.py")
        with open(path, "w") as f:
            f.write(text)


setup(
    ext_modules=[Extension("gpuaccel._C", sources=C_SOURCES, depends=HEADERS)],
    cmdclass={"build_ext": BuildExt},
)
