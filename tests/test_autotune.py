"""@mt.autotune: choosing the fastest config per key, skipping configs that fail, progress lines, the on-disk record
(written, read back, rebuilt when corrupt, reused by a second process), MINITRITON_AUTOTUNE=0, interpret mode,
reset_to_zero / restore_value, pruning, the grid's META and the error messages.

CPU tests run the real launch path on a fake driver and a fake compiler (no GPU), with a fake timer in place of the
CUDA-event benchmark: it launches the config, so compile and launch failures happen where they would on a GPU, and
returns a time chosen per config. The GPU test at the end autotunes the example matmul and checks it against torch.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import minitriton as mt
from minitriton import compiler
from minitriton.compiler import CompiledKernel
from minitriton.errors import CompilationError
from minitriton.ir.types import PointerType
from minitriton.runtime import autotune as autotune_module
from minitriton.runtime import set_driver
from minitriton.runtime.autotune import AutotuneError, AutotuneWarning, Autotuner, Config, ConfigLaunch
from minitriton.runtime.driver import CudaError
from minitriton.runtime.specialize import type_spelling

# ------------------------------------------------------------------------------------------ kernels


@mt.kernel
def scale(x, out, n, alpha, BLOCK: mt.constexpr, UNROLL: mt.constexpr = 1):
    offs = mt.program_id(0) * BLOCK + mt.arange(0, BLOCK)
    mask = offs < n
    mt.store(out + offs, mt.load(x + offs, mask=mask) * alpha, mask=mask)


@mt.kernel
def accumulate(x, acc, n, BLOCK: mt.constexpr):
    offs = mt.program_id(0) * BLOCK + mt.arange(0, BLOCK)
    mask = offs < n
    mt.store(acc + offs, mt.load(acc + offs, mask=mask) + mt.load(x + offs, mask=mask), mask=mask)
    mt.store(x + offs, mt.load(x + offs, mask=mask) * 2.0, mask=mask)


CONFIGS = [Config({"BLOCK": 64}, num_warps=4), Config({"BLOCK": 128}, num_warps=8),
           Config({"BLOCK": 256}, num_warps=4, num_stages=2)]


def grid(meta: dict) -> tuple[int]:
    return (mt.cdiv(meta["n"], meta["BLOCK"]),)


# --------------------------------------------------------------------------------------------- fakes


class FakeDriver:
    """The driver interface (runtime/driver.py) on the host: launches are recorded, nothing runs."""

    def __init__(self) -> None:
        self.launches: list[dict[str, Any]] = []

    def current_device(self) -> int:
        return -1  # CPU tensors are on the "current device"

    def current_stream(self, device: int) -> int:
        return 0

    def load_function(self, image: Any, name: str, device: int) -> Any:
        return f"fn:{name}"

    def launch(self, fn: Any, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, smem: int, stream: Any,
               params: int, extra: int) -> tuple[int]:
        self.launches.append(dict(grid=(gx, gy, gz), threads=bx))
        return (0,)

    def error_message(self, err: int) -> str:
        return f"FAKE_ERROR_{err}"

    def is_invalid_context(self, err: int) -> bool:
        return False


class FakeTimer:
    """The benchmark function: launches the config once (compiling it through the fake compiler) and returns the
    time `ms(config)`; records the configs it timed, in order."""

    def __init__(self, ms: Any = None, fail: dict[int, Exception] | None = None):
        self.ms = ms or (lambda c: 1000.0 / c.kwargs["BLOCK"])  # bigger blocks win unless told otherwise
        self.fail = fail or {}
        self.timed: list[Config] = []

    def __call__(self, launch: ConfigLaunch, warmup: int, rep: int) -> float:
        assert isinstance(launch, ConfigLaunch) and warmup == autotune_module.DEFAULT_WARMUP
        self.timed.append(launch.config)
        launch()
        if launch.config.kwargs["BLOCK"] in self.fail:
            raise self.fail[launch.config.kwargs["BLOCK"]]
        return self.ms(launch.config)

    @property
    def blocks(self) -> list[int]:
        return [c.kwargs["BLOCK"] for c in self.timed]


def fake_compile(failing_blocks: set[int]) -> Any:
    """compile_kernel that returns a CompiledKernel with the parameters a real one would have, or raises
    CompilationError (as ptxas would for too many registers) for the BLOCK values in failing_blocks."""

    def compile_kernel(fn, arg_types, constexprs, *, divisibility=None, equal_to_one=None, num_warps=4,
                       num_stages=3, target="cubin", keep_ir=False, min_blocks_per_sm=None):
        if constexprs.get("BLOCK") in failing_blocks:
            raise CompilationError(f"ptxas rejected the kernel:\nptxas error: too much shared data (BLOCK="
                                   f"{constexprs['BLOCK']})")
        params = []
        for name, ty in arg_types.items():
            size = 8 if isinstance(ty, PointerType) else max(1, ty.bits // 8)
            params.append({"name": name, "type": type_spelling(ty), "size": size, "align": size})
        meta = {"name": fn.__name__, "num_warps": num_warps, "num_stages": num_stages, "params": params,
                "shared": 0, "dynamic_shared": 0}
        return CompiledKernel(fn.__name__, "// fake ptx", b"fake cubin", meta)

    return compile_kernel


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINITRITON_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("MINITRITON_INTERPRET", "MINITRITON_AUTOTUNE", "MINITRITON_SKIP_AUTOTUNE"):
        monkeypatch.delenv(name, raising=False)
    scale.clear_cache()
    accumulate.clear_cache()


@pytest.fixture
def failing_blocks(monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """Installs the fake compiler; add BLOCK values to the returned set to make their compile fail."""
    blocks: set[int] = set()
    monkeypatch.setattr(compiler, "compile_kernel", fake_compile(blocks))
    return blocks


@pytest.fixture
def driver(failing_blocks: set[int]) -> Any:
    fake = FakeDriver()
    previous = set_driver(fake)
    yield fake
    set_driver(previous)


@pytest.fixture
def timer(monkeypatch: pytest.MonkeyPatch) -> FakeTimer:
    fake = FakeTimer()
    monkeypatch.setattr(autotune_module, "benchmark", fake)
    return fake


def no_benchmark(*args: Any, **kwargs: Any) -> float:
    raise AssertionError("benchmarked")


def tuned(kernel: Any = scale, configs: list[Config] = CONFIGS, key: tuple = ("n",), **options: Any) -> Autotuner:
    return mt.autotune(configs=list(configs), key=list(key), **options)(kernel)


def inputs(n: int = 1000, dtype: torch.dtype = torch.float32) -> tuple:
    return torch.randn(n).to(dtype), torch.empty(n, dtype=dtype), n, 0.5


# ------------------------------------------------------------------------------------- choosing


def test_best_config_is_chosen_and_launched(driver: FakeDriver, timer: FakeTimer,
                                            capsys: pytest.CaptureFixture) -> None:
    timer.ms = lambda c: {64: 0.9, 128: 0.3, 256: 0.5}[c.kwargs["BLOCK"]]
    tuner = tuned()
    x, out, n, alpha = inputs()
    tuner[grid](x, out, n, alpha)
    assert timer.blocks == [64, 128, 256]
    assert tuner.best[tuner._key_of(x, out, n, alpha)] == CONFIGS[1]
    final = driver.launches[-1]
    assert final["grid"] == (8, 1, 1) and final["threads"] == 8 * 32  # BLOCK=128 and num_warps=8 of the winner
    err = capsys.readouterr().err.splitlines()
    label = "[autotune scale n=1000]"
    assert err[0] == f"{label} 1/3 BLOCK=64 num_warps=4: 0.900 ms"
    assert err[1] == f"{label} 2/3 BLOCK=128 num_warps=8: 0.300 ms"
    assert err[2] == f"{label} 3/3 BLOCK=256 num_warps=4 num_stages=2: 0.500 ms"
    assert err[3].startswith(f"{label} best BLOCK=128 num_warps=8: 0.300 ms (3 of 3 configs ran,")
    assert len(err) == 4


def test_same_key_goes_straight_to_the_winner(driver: FakeDriver, timer: FakeTimer,
                                              capsys: pytest.CaptureFixture, monkeypatch) -> None:
    tuner = tuned()
    x, out, n, alpha = inputs()
    tuner[grid](x, out, n, alpha)
    capsys.readouterr()
    monkeypatch.setattr(tuner, "_tune", no_benchmark)
    launches = len(driver.launches)
    for _ in range(3):
        tuner[grid](x, out, n, alpha=alpha)
    assert len(driver.launches) == launches + 3 and len(timer.timed) == 3
    assert {launch["grid"] for launch in driver.launches[launches:]} == {(4, 1, 1)}  # BLOCK=256 won
    assert capsys.readouterr().err == ""


def test_key_change_retunes(driver: FakeDriver, timer: FakeTimer) -> None:
    timer.ms = lambda c: abs(c.kwargs["BLOCK"] - n_best[0])  # the block closest to n_best wins
    n_best = [64]
    tuner = tuned()
    x, out, n, alpha = inputs(1000)
    tuner[grid](x, out, n, alpha)
    n_best[0] = 256
    tuner[grid](x, out, 1000, alpha)  # same key: no tuning, still BLOCK=64
    assert len(timer.timed) == 3 and driver.launches[-1]["grid"] == (16, 1, 1)
    tuner[grid](*inputs(2000))  # new n
    assert len(timer.timed) == 6 and driver.launches[-1]["grid"] == (8, 1, 1)
    tuner[grid](*inputs(2000, torch.float16))  # same n, another dtype of a non-key tensor
    assert len(timer.timed) == 9
    assert len(tuner.best) == 3


def test_tensor_key_is_dtype_and_shape(driver: FakeDriver, timer: FakeTimer) -> None:
    tuner = tuned(key=("x",))
    x, out, n, alpha = inputs(1000)
    tuner[grid](x, out, n, alpha)
    tuner[grid](torch.randn(1000), out, n, alpha)  # another tensor, same dtype and shape
    assert len(timer.timed) == 3
    tuner[grid](torch.randn(10, 100).flatten().view(10, 100), out, n, alpha)  # same count, other shape
    assert len(timer.timed) == 6
    key = tuner._key_of(x, out, n, alpha)
    assert key[0] == (torch.float32, (1000,))


def test_do_bench_parameter_replaces_the_module_benchmark(driver: FakeDriver, monkeypatch) -> None:
    monkeypatch.setattr(autotune_module, "benchmark", no_benchmark)
    own = FakeTimer(ms=lambda c: c.kwargs["BLOCK"])  # the smallest block wins
    tuner = tuned(do_bench=own)
    tuner[grid](*inputs())
    assert own.blocks == [64, 128, 256] and driver.launches[-1]["grid"] == (16, 1, 1)


def test_grid_callable_gets_the_chosen_meta_parameters(driver: FakeDriver, timer: FakeTimer) -> None:
    seen: list[dict] = []

    def recording_grid(meta: dict) -> tuple[int]:
        seen.append(dict(meta))
        return (3,)

    tuner = tuned()
    tuner[recording_grid](*inputs())
    final = seen[-1]
    assert final["BLOCK"] == 256 and final["num_warps"] == 4 and final["num_stages"] == 2
    assert final["n"] == 1000 and final["UNROLL"] == 1
    assert {m["BLOCK"] for m in seen} == {64, 128, 256}


# -------------------------------------------------------------------------------------- failures


def test_failing_configs_are_skipped_with_a_warning(driver: FakeDriver, timer: FakeTimer, failing_blocks: set,
                                                    capsys: pytest.CaptureFixture) -> None:
    failing_blocks.add(256)  # fails to compile: the fastest config on paper
    timer.fail = {64: CudaError("cuLaunchKernel of kernel 'scale' failed: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES")}
    tuner = tuned()
    with pytest.warns(AutotuneWarning) as caught:
        tuner[grid](*inputs())
    messages = sorted(str(w.message) for w in caught)
    assert messages == [
        "autotune scale: config BLOCK=256 num_warps=4 num_stages=2 skipped: CompilationError: ptxas rejected the "
        "kernel:",
        "autotune scale: config BLOCK=64 num_warps=4 skipped: CudaError: cuLaunchKernel of kernel 'scale' failed: "
        "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
    ]
    assert all("\n" not in m for m in messages)
    assert driver.launches[-1]["grid"] == (8, 1, 1)  # BLOCK=128, the only one left
    err = capsys.readouterr().err
    assert "1/3 BLOCK=64 num_warps=4: skipped (CudaError: cuLaunchKernel" in err
    assert "3/3 BLOCK=256 num_warps=4 num_stages=2: skipped (CompilationError: ptxas rejected" in err
    assert "best BLOCK=128 num_warps=8: 7.812 ms (1 of 3 configs ran" in err
    timings = next(iter(tuner.timings.values()))
    assert timings == {"BLOCK=64 num_warps=4": None, "BLOCK=128 num_warps=8": 7.8125,
                       "BLOCK=256 num_warps=4 num_stages=2": None}


def test_every_config_failing_is_an_autotune_error(driver: FakeDriver, timer: FakeTimer, failing_blocks: set) -> None:
    failing_blocks.update({64, 128, 256})
    tuner = tuned()
    with pytest.warns(AutotuneWarning), pytest.raises(AutotuneError) as info:
        tuner[grid](*inputs())
    message = str(info.value)
    assert message.startswith("autotuned kernel 'scale': every config failed for n=1000 (BLOCK=64 num_warps=4: "
                              "CompilationError: ptxas rejected the kernel:;")
    assert "BLOCK=256 num_warps=4 num_stages=2: CompilationError" in message
    assert isinstance(info.value.__cause__, CompilationError)
    assert not tuner.best and not list((Path(os.environ["MINITRITON_CACHE_DIR"]) / "autotune").glob("*.json"))


def test_user_mistakes_are_not_skipped(driver: FakeDriver, timer: FakeTimer) -> None:
    tuner = tuned()
    x, out, n, alpha = inputs()
    with pytest.raises(TypeError, match=r"kernel 'scale' is missing argument\(s\) 'alpha'"):
        tuner[grid](x, out, n)
    with pytest.raises(TypeError, match="unknown keyword argument 'beta'"):
        tuner[grid](x, out, n, alpha, beta=1)
    with pytest.raises(TypeError, match="argument 'n' of kernel 'scale' is a builtins.str"):
        tuner[grid](x, out, "1000", alpha)
    assert timer.blocks == [64]  # the bad argument surfaced at the first launch and was not skipped
    assert not tuner.best


# -------------------------------------------------------------------------------------- on disk


def record_files() -> list[Path]:
    return sorted((Path(os.environ["MINITRITON_CACHE_DIR"]) / "autotune").glob("*.json"))


def test_record_is_written_and_read_back(driver: FakeDriver, timer: FakeTimer, monkeypatch) -> None:
    first = tuned()
    first[grid](*inputs())
    files = record_files()
    assert files == [first.cache_path()] and files[0].parent.name == "autotune"
    record = json.loads(files[0].read_text())
    assert record["format"] == 1 and record["kernel"] == "scale" and record["key"] == ["n"]
    (entry_key, entry), = record["entries"].items()
    assert entry_key.startswith(f"{autotune_module.device_name()}|n|(1000, ")
    assert entry["config"] == "BLOCK=256 num_warps=4 num_stages=2" and entry["ms"] == pytest.approx(1000 / 256)
    assert set(entry["timings"]) == {c.describe() for c in CONFIGS}

    monkeypatch.setattr(autotune_module, "benchmark", no_benchmark)
    second = tuned()  # a fresh tuner on the same kernel: the record answers
    second[grid](*inputs())
    assert list(second.best.values()) == [CONFIGS[2]] and driver.launches[-1]["grid"] == (4, 1, 1)
    assert not list((files[0].parent).glob(".*"))  # no temporary file left behind


def test_record_of_a_config_no_longer_listed_is_retuned(driver: FakeDriver, timer: FakeTimer) -> None:
    tuned()[grid](*inputs())
    narrower = tuned(configs=CONFIGS[:2])  # the recorded winner (BLOCK=256) is gone
    narrower[grid](*inputs())
    assert timer.blocks == [64, 128, 256, 64, 128]
    assert list(narrower.best.values()) == [CONFIGS[1]]


def test_corrupt_record_is_ignored_and_rewritten(driver: FakeDriver, timer: FakeTimer,
                                                 capsys: pytest.CaptureFixture) -> None:
    tuner = tuned()
    path = tuner.cache_path()
    for garbage in ('{"format": 1, "entries": {"k": {"config": 3', '[1, 2]', '{"format": 1, "entries": {"k": 1}}'):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(garbage)
        tuner.clear_cache()
        timer.timed.clear()
        tuner[grid](*inputs())
        assert timer.blocks == [64, 128, 256]
        assert f"minitriton: autotune cache {path} is corrupt" in capsys.readouterr().err
        entries = json.loads(path.read_text())["entries"]
        assert [e["config"] for e in entries.values()] == ["BLOCK=256 num_warps=4 num_stages=2"]


def test_record_keeps_other_keys(driver: FakeDriver, timer: FakeTimer) -> None:
    tuner = tuned()
    tuner[grid](*inputs(1000))
    tuned()[grid](*inputs(2000))  # another tuner (another process, say) adds its key
    assert len(json.loads(tuner.cache_path().read_text())["entries"]) == 2


KERNEL_FILE = """
import minitriton as mt

@mt.autotune(configs=[mt.Config({"BLOCK": 64}), mt.Config({"BLOCK": 128}, num_warps=8),
                      mt.Config({"BLOCK": 32}, num_warps=2)], key=["n"])
@mt.kernel
def copy(x, out, n, BLOCK: mt.constexpr):
    offs = mt.arange(0, BLOCK)
    mt.store(out + offs, mt.load(x + offs, mask=offs < n), mask=offs < n)
"""

PROCESS_SCRIPT = """
import sys
sys.path.insert(0, {folder!r})
import torch
import kernel_file
from minitriton import compiler
from minitriton.compiler import CompiledKernel
from minitriton.runtime import autotune, set_driver

def compile_kernel(fn, arg_types, constexprs, *, num_warps=4, num_stages=3, **options):
    params = [{{"name": n, "type": "*fp32" if n != "n" else "i32", "size": 8 if n != "n" else 4,
               "align": 8 if n != "n" else 4}} for n in arg_types]
    meta = {{"name": fn.__name__, "num_warps": num_warps, "num_stages": num_stages, "params": params}}
    return CompiledKernel(fn.__name__, "// ptx", b"cubin", meta)

compiler.compile_kernel = compile_kernel

class Driver:
    launches = []
    def current_device(self): return -1
    def current_stream(self, device): return 0
    def load_function(self, image, name, device): return "fn"
    def launch(self, fn, gx, gy, gz, bx, *rest):
        self.launches.append(bx)
        return (0,)

driver = Driver()
set_driver(driver)
timed = []

def bench(launch, warmup, rep):
    if {forbid_benchmark!r}:
        raise AssertionError("the second process benchmarked")
    timed.append(launch.config.kwargs["BLOCK"])
    launch()
    return {{64: 2.0, 128: 1.0, 32: 3.0}}[launch.config.kwargs["BLOCK"]]

autotune.benchmark = bench
x = torch.randn(100)
kernel_file.copy[(1,)](x, torch.empty(100), 100)
print(timed, driver.launches[-1])
"""


def test_second_process_reuses_the_record(tmp_path: Path) -> None:
    folder = tmp_path / "kernels"
    folder.mkdir()
    (folder / "kernel_file.py").write_text(KERNEL_FILE)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(Path(__file__).resolve().parents[1]),
                                                    env.get("PYTHONPATH", "")] if p)
    outputs = []
    for forbid in (False, True):
        script = tmp_path / f"process_{forbid}.py"
        script.write_text(PROCESS_SCRIPT.format(folder=str(folder), forbid_benchmark=forbid))
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        outputs.append((done.stdout.strip(), done.stderr))
    assert outputs[0][0] == "[64, 128, 32] 256"  # tuned: BLOCK=128 with 8 warps (256 threads) won
    assert "[autotune copy n=100] best BLOCK=128 num_warps=8: 1.000 ms" in outputs[0][1]
    assert outputs[1][0] == "[] 256"  # the second process launched the winner without benchmarking
    assert "[autotune" not in outputs[1][1]


# ------------------------------------------------------------------------------- turning it off


@pytest.mark.parametrize("variable, value", [("MINITRITON_AUTOTUNE", "0"), ("MINITRITON_SKIP_AUTOTUNE", "1")])
def test_environment_skips_benchmarking(driver: FakeDriver, monkeypatch, capsys: pytest.CaptureFixture,
                                        variable: str, value: str) -> None:
    monkeypatch.setattr(autotune_module, "benchmark", no_benchmark)
    monkeypatch.setenv(variable, value)
    tuner = tuned()
    tuner[grid](*inputs())
    assert list(tuner.best.values()) == [CONFIGS[0]] and driver.launches[-1]["grid"] == (16, 1, 1)
    assert capsys.readouterr().err == "" and record_files() == []


def test_environment_values_that_keep_tuning_on(monkeypatch) -> None:
    for variable, value in [("MINITRITON_AUTOTUNE", "1"), ("MINITRITON_SKIP_AUTOTUNE", "0"),
                            ("MINITRITON_SKIP_AUTOTUNE", "")]:
        monkeypatch.setenv(variable, value)
        assert not autotune_module.tuning_disabled()
        monkeypatch.delenv(variable)
    assert not autotune_module.tuning_disabled()


def test_interpret_mode_runs_the_interpret_config_without_benchmarking(monkeypatch,
                                                                        capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(autotune_module, "benchmark", no_benchmark)
    monkeypatch.setenv("MINITRITON_INTERPRET", "1")
    blocks: list[int] = []

    def recording_grid(meta: dict) -> tuple[int]:
        blocks.append(meta["BLOCK"])
        return (mt.cdiv(meta["n"], meta["BLOCK"]),)

    for index, block in [(0, 64), (2, 256)]:
        tuner = tuned(interpret_config=index)
        x, out, n, alpha = torch.randn(300), torch.full((300,), float("nan")), 300, 1.5
        tuner[recording_grid](x, out, n, alpha)
        torch.testing.assert_close(out, x * 1.5, rtol=1e-6, atol=0)  # float32 multiply: exact up to rounding
        assert blocks[-1] == block and not tuner.best
    assert capsys.readouterr().err == ""


def test_example_matmul_autotuned_in_the_interpreter(monkeypatch) -> None:
    from minitriton.kernels.examples import matmul

    monkeypatch.setattr(autotune_module, "benchmark", no_benchmark)
    monkeypatch.setenv("MINITRITON_INTERPRET", "1")
    a, b = torch.randn(70, 40).to(torch.bfloat16), torch.randn(40, 90).to(torch.bfloat16)
    out = matmul.matmul_autotuned(a, b)
    ref = matmul.reference(a, b)
    assert ((out.double() - ref.double()).norm() / ref.double().norm()).item() <= 1e-2  # bf16 output rounding


def test_single_config_after_pruning_is_not_benchmarked(driver: FakeDriver, monkeypatch) -> None:
    monkeypatch.setattr(autotune_module, "benchmark", no_benchmark)
    tuner = tuned(prune_configs_by=lambda configs, named: configs[1:2])
    tuner[grid](*inputs())
    assert list(tuner.best.values()) == [CONFIGS[1]] and record_files() == []


# ---------------------------------------------------------------------------- hooks and pruning


def test_reset_to_zero_and_restore_value(driver: FakeDriver) -> None:
    x, acc = torch.randn(512), torch.zeros(512)
    original = x.clone()
    seen: list[tuple[bool, bool]] = []

    def clobbering_timer(launch: ConfigLaunch, warmup: int, rep: int) -> float:
        seen.append((bool((acc == 0).all()), torch.equal(x, original)))
        launch()
        x.mul_(2.0)  # what the kernel does to its input, each launch...
        acc.add_(x)  # ...and to its accumulator
        return float(launch.config.kwargs["BLOCK"])

    tuner = tuned(accumulate, do_bench=clobbering_timer, reset_to_zero=["acc"], restore_value=["x"])
    tuner[grid](x, acc, 512)
    assert seen == [(True, True)] * 3  # every config started from the caller's values
    assert torch.equal(x, original) and bool((acc == 0).all())  # and so did the real launch

    careless = tuned(accumulate, do_bench=clobbering_timer)  # without the hooks the benchmark clobbers both
    careless[grid](x, acc, 500)  # another n: the record of n=512 would answer without benchmarking
    assert not torch.equal(x, original) and not bool((acc == 0).all())


def test_reset_to_zero_of_a_scalar_is_a_type_error(driver: FakeDriver, timer: FakeTimer) -> None:
    tuner = tuned(reset_to_zero=["n"])
    with pytest.raises(TypeError, match="reset_to_zero of autotuned kernel 'scale' names 'n', which is int, not a "
                                        "tensor"):
        tuner[grid](*inputs())


def test_prune_configs_by_gets_the_named_arguments(driver: FakeDriver, timer: FakeTimer) -> None:
    calls: list[tuple[list, dict]] = []

    def prune(configs: list[Config], named: dict) -> list[Config]:
        calls.append((configs, named))
        return [c for c in configs if c.kwargs["BLOCK"] <= named["n"]]

    tuner = tuned(prune_configs_by=prune)
    x, out, n, alpha = inputs(200)
    tuner[grid](x, out, n, alpha)
    (configs, named), = calls
    assert configs == CONFIGS and set(named) == {"x", "out", "n", "alpha", "UNROLL"}
    assert named["n"] == 200 and named["x"] is x
    assert timer.blocks == [64, 128]
    triton_style = tuned(prune_configs_by={"early_config_prune": lambda configs, named: configs[:2]})
    triton_style[grid](*inputs(300))
    assert timer.blocks == [64, 128, 64, 128]


def test_prune_leaving_nothing_is_an_error(driver: FakeDriver, timer: FakeTimer) -> None:
    tuner = tuned(prune_configs_by=lambda configs, named: [])
    with pytest.raises(ValueError, match="prune_configs_by of autotuned kernel 'scale' left no config for n=1000"):
        tuner[grid](*inputs())


# -------------------------------------------------------------------------------- error messages


def test_tuned_arguments_may_not_be_passed(driver: FakeDriver, timer: FakeTimer) -> None:
    tuner = tuned()
    x, out, n, alpha = inputs()
    with pytest.raises(TypeError, match="autotuned kernel 'scale' got 'BLOCK', which @mt.autotune chooses from its "
                                        "configs; leave it out of the launch"):
        tuner[grid](x, out, n, alpha, BLOCK=64)
    with pytest.raises(TypeError, match="got 'BLOCK', which"):
        tuner[grid](x, out, n, alpha, 64)
    with pytest.raises(TypeError, match="got 'num_warps', which"):
        tuner[grid](x, out, n, alpha, num_warps=4)
    with pytest.raises(TypeError, match="got 'num_stages', which"):
        tuner[grid](x, out, n, alpha, num_stages=4)
    assert timer.timed == []
    tuner[grid](x, out, n, alpha, UNROLL=2)  # constexprs the configs leave alone are the caller's
    with pytest.raises(TypeError, match="launched as scale\\[grid\\]"):
        tuner(x, out, n, alpha)


def test_options_the_configs_leave_alone_are_the_callers(driver: FakeDriver, timer: FakeTimer) -> None:
    tuner = tuned(configs=[Config({"BLOCK": 64}), Config({"BLOCK": 128})])
    tuner[grid](*inputs(), num_warps=2)
    assert driver.launches[-1]["threads"] == 64
    tuner[grid](*inputs(), num_warps=16)  # part of the key: tuned again
    assert driver.launches[-1]["threads"] == 512 and len(tuner.best) == 2


@pytest.mark.parametrize("make, error, message", [
    (lambda: mt.autotune(configs=CONFIGS, key=["n"])(scale.fn), TypeError, "@mt.autotune goes above @mt.kernel"),
    (lambda: mt.autotune(configs=CONFIGS, key=["n"])(tuned()), TypeError, "autotuned twice"),
    (lambda: tuned(configs=[]), ValueError, "configs is empty"),
    (lambda: tuned(configs=[{"BLOCK": 64}]), TypeError, "configs must be mt.Config objects"),
    (lambda: tuned(configs=[Config({"BLOCKS": 64})]), ValueError, "sets 'BLOCKS', which is not a parameter"),
    (lambda: tuned(configs=[Config({"alpha": 2.0})]), ValueError, "sets 'alpha', which is a runtime parameter"),
    (lambda: tuned(key=()), ValueError, "key must be a non-empty list"),
    (lambda: mt.autotune(configs=CONFIGS, key="n")(scale), ValueError, "key must be a non-empty list"),
    (lambda: tuned(key=("m",)), ValueError, "key names 'm', which is not a parameter"),
    (lambda: tuned(key=("BLOCK",)), ValueError, "key names 'BLOCK', which the configs set"),
    (lambda: tuned(restore_value=["y"]), ValueError, "restore_value names 'y', which is not a runtime"),
    (lambda: tuned(reset_to_zero=["BLOCK"]), ValueError, "reset_to_zero names 'BLOCK', which is not a runtime"),
    (lambda: tuned(interpret_config=3), ValueError, "interpret_config=3 is not an index into the 3 configs"),
    (lambda: tuned(rep=0), ValueError, "warmup \\(>= 0\\) and rep \\(>= 1\\) count launches"),
    (lambda: tuned(prune_configs_by={"perf_model": None}), TypeError, "perf_model and top_k are not supported"),
    (lambda: Config([("BLOCK", 64)]), TypeError, "mt.Config takes a dict"),
    (lambda: Config({"num_warps": 8}), TypeError, "pass num_warps as a keyword"),
    (lambda: Config({"BLOCK": 64}, num_warps=3), ValueError, "num_warps=3; expected one of 1, 2, 4, 8, 16, 32"),
    (lambda: Config({"BLOCK": 64}, num_stages=0), ValueError, "num_stages=0; expected an int >= 1"),
])
def test_declaration_errors(make: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        make()


def test_unhashable_key_argument(driver: FakeDriver, timer: FakeTimer) -> None:
    tuner = tuned(key=("UNROLL",), configs=[Config({"BLOCK": 64})])
    with pytest.raises(TypeError, match="key argument 'UNROLL' of autotuned kernel 'scale' = \\[1\\] is not hashable"):
        tuner[grid](*inputs(), UNROLL=[1])


def test_config_equality_and_description() -> None:
    config = Config({"BLOCK_M": 128, "MODE": "fast"}, num_warps=8, num_stages=3)
    assert config.describe() == "BLOCK_M=128 MODE='fast' num_warps=8 num_stages=3"
    assert config.all_kwargs() == {"BLOCK_M": 128, "MODE": "fast", "num_warps": 8, "num_stages": 3}
    assert config == Config({"BLOCK_M": 128, "MODE": "fast"}, num_warps=8, num_stages=3)
    assert config != Config({"BLOCK_M": 128, "MODE": "fast"}, num_warps=8)
    assert len({config, Config({"BLOCK_M": 128, "MODE": "fast"}, num_warps=8, num_stages=3)}) == 1
    assert Config({}).describe() == "(defaults)"
    assert repr(config) == "Config({'BLOCK_M': 128, 'MODE': 'fast'}, num_warps=8, num_stages=3)"


def test_specialize_declares_on_the_underlying_kernel() -> None:
    @mt.kernel
    def fresh(x, n, BLOCK: mt.constexpr):
        pass

    tuner = tuned(fresh, configs=[Config({"BLOCK": 64})])
    assert tuner.specialize("*fp32:16,i32", BLOCK=128) is tuner
    assert tuner.specializations is fresh.specializations and len(fresh.specializations) == 1
    assert fresh.specializations[0].constexprs == {"BLOCK": 128}
    assert tuner.fn is fresh.fn and tuner.arg_names == ["x", "n", "BLOCK"] and tuner.__name__ == "fresh"
    assert repr(tuner) == "<mt.autotune fresh(x, n, BLOCK) over 1 configs>"


def test_exports() -> None:
    assert mt.autotune is autotune_module.autotune and mt.Config is Config


# ---------------------------------------------------------------------------- the CUDA-event timer


def test_benchmark_is_the_median_of_event_timed_launches(monkeypatch) -> None:
    """The default benchmark with torch.cuda's events and synchronize replaced by a fake clock that each launch
    advances by its own duration: one compiling launch, `warmup` untimed, `rep` timed, the median returned."""
    clock = [0.0]
    durations = iter([100.0] + [50.0] * 2 + [1.0, 9.0, 2.0, 8.0, 3.0])
    launches: list[float] = []

    class Event:
        def __init__(self, enable_timing: bool = False):
            assert enable_timing
            self.at: float | None = None

        def record(self) -> None:
            self.at = clock[0]

        def synchronize(self) -> None:
            pass

        def elapsed_time(self, end: "Event") -> float:
            return end.at - self.at

    def launch() -> None:
        step = next(durations)
        launches.append(step)
        clock[0] += step

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    slept: list[tuple[int, int]] = []  # (cycles, launches made before the sleep was queued)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: slept.append((cycles, len(launches))), raising=False)
    assert autotune_module.benchmark(launch, warmup=2, rep=5) == 3.0
    assert len(launches) == 8
    assert slept == [(5 * autotune_module.SLEEP_CYCLES_PER_LAUNCH, 3)]  # queued right before the timed launches


# ------------------------------------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_autotuned_matmul_matches_torch(capfd: pytest.CaptureFixture) -> None:
    """The example matmul tuned over all its configs (each compiles, loads and runs), then checked against torch;
    the same shape again launches the winner without tuning, a new shape tunes again."""
    from minitriton.kernels.examples import matmul

    set_driver(None)  # the real driver
    tuner = matmul.matmul_kernel_autotuned
    tuner.clear_cache()
    capfd.readouterr()
    for m, n, k in [(1000, 600, 520), (1016, 600, 520)]:  # M changes the key, not the compiled variants
        a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        b = torch.randn(k, n, device="cuda").to(torch.bfloat16)
        out = matmul.matmul_autotuned(a, b)
        ref = matmul.reference(a, b)
        rel = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
        assert rel <= 1e-2, f"{m}x{n}x{k}: relative error {rel}"  # bf16 output rounding, fp32 accumulation
        err = capfd.readouterr().err
        total = len(matmul.MATMUL_CONFIGS)
        for i in range(1, total + 1):
            assert f"[autotune matmul_kernel M={m} N={n} K={k}] {i}/{total} BLOCK_M=" in err
        assert f"[autotune matmul_kernel M={m} N={n} K={k}] best " in err
        timings = tuner.timings[tuner._key_of(a, b, out, out, m, n, k, *a.stride(), *b.stride(), *out.stride())]
        assert all(ms is not None and ms > 0 for ms in timings.values()), timings
        again = matmul.matmul_autotuned(a, b)
        torch.testing.assert_close(again, out, rtol=0, atol=0)
        assert "[autotune" not in capfd.readouterr().err
    assert tuner.cache_path().is_file()
