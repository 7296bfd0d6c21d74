"""`import gpuaccel` and `python -m gpuaccel` from a source folder without a
built extension (the repository root after `pip install .`) use the installed
copy; an in-place build is used as it is; with neither, one clear error."""

import json
import os
import shutil

import gpuaccel

from helpers import run_python

INSTALLED = os.path.dirname(os.path.abspath(gpuaccel.__file__))
SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpuaccel")


def source_folder(root):
    """A copy of the repository's gpuaccel/ Python files, as a fresh clone has them."""
    dest = root / "gpuaccel"
    dest.mkdir()
    for name in os.listdir(SOURCE):
        if name.endswith(".py") and name != "_build_config.py":
            shutil.copy(os.path.join(SOURCE, name), dest / name)
    return dest


def test_import_from_the_source_folder_uses_the_installed_copy(tmp_path):
    source_folder(tmp_path)
    code = ("import gpuaccel, os; "
            "print(os.path.dirname(gpuaccel.__file__)); print(os.path.dirname(gpuaccel._C.__file__)); "
            "print(gpuaccel.matmul(gpuaccel.ones((2, 3)), gpuaccel.ones((3, 2))).tolist())")
    run = run_python("-c", code, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    init, ext, product = run.stdout.splitlines()
    assert os.path.samefile(init, INSTALLED) and os.path.samefile(ext, INSTALLED)
    assert product == "[[3.0, 3.0], [3.0, 3.0]]"
    assert run.stderr == ""


def test_python_m_from_the_source_folder_runs_the_installed_cli(tmp_path):
    source_folder(tmp_path)
    run = run_python("-m", "gpuaccel", "doctor", "--json", cwd=tmp_path, timeout=300)
    assert run.returncode in (0, 1), run.stderr
    assert os.path.samefile(json.loads(run.stdout)["facts"]["gpuaccel_path"], INSTALLED)


def test_submodules_come_from_the_same_copy(tmp_path):
    source_folder(tmp_path)
    code = ("import gpuaccel, gpuaccel.logger, gpuaccel.loader, os; "
            "print(len({os.path.dirname(m.__file__) for m in (gpuaccel._api, gpuaccel.logger, gpuaccel.loader)}))")
    run = run_python("-c", code, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "1"


def test_without_any_built_copy_the_error_says_what_to_do(tmp_path):
    source_folder(tmp_path)
    # only the bare source folder is importable: PYTHONPATH empty, site-packages off
    run = run_python("-S", "-c", "import gpuaccel", cwd=tmp_path, env={"PYTHONPATH": ""})
    assert run.returncode == 1
    assert "ImportError" in run.stderr and "pip install ." in run.stderr
    assert str(tmp_path / "gpuaccel") in run.stderr


def test_an_in_place_build_is_used_as_it_is(tmp_path):
    # a folder with its own extension (here: a copy of the installed one) wins over the installed copy
    shutil.copytree(INSTALLED, tmp_path / "gpuaccel", ignore=shutil.ignore_patterns("__pycache__"))
    run = run_python("-c", "import gpuaccel; print(gpuaccel.__file__)", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert os.path.samefile(os.path.dirname(run.stdout.strip()), tmp_path / "gpuaccel")


def test_a_cpu_only_build_on_a_machine_with_a_driver_says_so_at_import():
    from gpuaccel import _api

    notice = _api.cpu_only_notice(False, "no nvcc found (set CUDA_HOME or put nvcc on PATH)", True)
    assert notice.startswith("gpuaccel is a CPU-only build (no nvcc found") and "doctor" in notice
    assert _api.cpu_only_notice(True, "", True) is None          # a CUDA build
    assert _api.cpu_only_notice(False, "no nvcc found", False) is None  # no driver: CPU-only is right
    assert _api.cpu_only_notice(False, "GPUACCEL_NO_CUDA=1", True) is None  # asked for
    assert _api.cpu_only_notice(False, "GPUACCEL_SIM=1 (simulated CUDA runtime, a test build)", True) is None


def test_the_import_notice_is_silenced_by_its_documented_filter(tmp_path):
    # the import on this machine: a notice only where the rule says so, and the filter the notice names works
    from gpuaccel import _api, _build_config

    expected = _api.cpu_only_notice(_build_config.BUILT_WITH_CUDA, _build_config.CUDA_BUILD_NOTE,
                                    os.path.exists(_api.NVIDIA_DRIVER_FILE))
    run = run_python("-W", "always", "-c", "import gpuaccel")
    assert run.returncode == 0
    assert ("CPU-only build" in run.stderr) == (expected is not None), run.stderr
    run = run_python("-c", "import warnings; warnings.filterwarnings('ignore', message='gpuaccel is a CPU-only build');"
                     " import gpuaccel")
    assert run.returncode == 0 and "CPU-only" not in run.stderr
    # the filter the notice names silences the notice itself (on any machine: the
    # notice is made here rather than by an import that qualifies for it)
    import warnings

    notice = _api.cpu_only_notice(False, "no nvcc found", True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn(notice, RuntimeWarning, stacklevel=1)
        warnings.filterwarnings("ignore", message="gpuaccel is a CPU-only build")
        warnings.warn(notice, RuntimeWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == [notice]
    assert "warnings.filterwarnings('ignore', message='gpuaccel is a CPU-only build')" in notice


def test_pytest_without_an_installed_gpuaccel_says_what_to_run():
    # as after `pip uninstall gpuaccel`: the import system finds no gpuaccel anywhere
    tests = os.path.dirname(os.path.abspath(__file__))
    code = ("import sys, pytest\n"
            "class NotInstalled:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'gpuaccel':\n"
            "            raise ModuleNotFoundError('No module named ' + name, name=name)\n"
            "sys.meta_path.insert(0, NotInstalled())\n"
            "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '--collect-only', %r]))\n"
            % os.path.join(tests, "test_readme.py"))
    run = run_python("-c", code, cwd=os.path.dirname(tests), timeout=300)
    assert run.returncode != 0
    output = run.stdout + run.stderr
    assert "gpuaccel is not installed in this Python" in output and 'pip install ".[test]"' in output, output
    assert "ModuleNotFoundError" not in output, output
