"""`@mt.autotune(configs=[...], key=[...])` stacked above `@mt.kernel`: benchmark the configs once per key, then
launch with the fastest.

    @mt.autotune(configs=[mt.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64}, num_warps=8, num_stages=3),
                          mt.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32}, num_warps=4)],
                 key=["M", "N", "K"])
    @mt.kernel
    def matmul_kernel(a, b, c, M, N, K, ..., BLOCK_M: mt.constexpr, BLOCK_N: mt.constexpr, BLOCK_K: mt.constexpr):
        ...

    grid = lambda META: (mt.cdiv(M, META["BLOCK_M"]), mt.cdiv(N, META["BLOCK_N"]))
    matmul_kernel[grid](a, b, c, M, N, K, ...)      # no BLOCK_* here: the tuner passes them

How a launch works. A generated function with the kernel's own parameter list (as binder.py does for launches)
binds the arguments and returns the tuning key: the values of the `key` arguments (a tensor among them stands for
its dtype and shape), the dtype of every other runtime argument that has one (a config tuned for bf16 is not
reused for fp32, as in Triton) and the options the configs leave to the caller. It also rejects, with a
TypeError, a tuned constexpr (or num_warps / num_stages that a config sets) passed by the caller. One dict lookup
then gives the winning Config, whose constexprs and options are passed as keywords to `kernel[grid]`: a grid
callable sees them in META. Everything else happens only for a key not seen yet in this process (`_tune`):
  1. `prune_configs_by(configs, named_args)` narrows the list (named_args: every argument by name, defaults
     included, tuned constexprs left out).
  2. MINITRITON_AUTOTUNE=0 or MINITRITON_SKIP_AUTOTUNE=1, or a single config left: the first one, nothing measured
     and nothing written to disk.
  3. The on-disk record, `<MINITRITON_CACHE_DIR>/autotune/<sha256 of kernel fingerprint + compiler version +
     arch>.json`: {device name | key names | key -> winning config}. A hit whose config is still in the list is
     used without benchmarking. A corrupt file is reported on stderr, ignored and rewritten by the next tuning;
     writes are atomic (temporary file + os.replace; concurrent writers lose at most an entry, i.e. a re-tune).
  4. Every config is benchmarked through `benchmark` (or the `do_bench=` given): its first launch compiles and
     loads, then a few warm-up launches, then the median of N launches each timed by CUDA events on torch's
     current stream. A config that fails to compile (CompilationError, ptxas errors included), needs more shared
     memory than the device has, or fails to launch (RuntimeError, CudaError) is skipped with an AutotuneWarning;
     if every config fails, AutotuneError. One progress line per config and one for the winner go to stderr:
         [autotune matmul_kernel M=4096 N=4096 K=4096] 3/8 BLOCK_M=128 BLOCK_N=128 BLOCK_K=64 num_warps=8 ...: 0.412 ms
     Before each config, the `restore_value` tensors get their values from before tuning back and the
     `reset_to_zero` tensors are zeroed, and once more before the real launch, so benchmarking never changes what
     the caller's launch computes.
MINITRITON_INTERPRET=1 (read at every launch) measures nothing: `configs[interpret_config]` (default the first).

Benchmarking calls `benchmark(launch, warmup=..., rep=...)` through the module attribute at call time, so tests
replace it (or pass `do_bench=`); `launch` is a ConfigLaunch whose `.config` says which config it runs.

Ahead of time: `tuner.specialize(...)` declares on the underlying kernel (`tuner.kernel`); `minitriton compile`
compiles each declared specialization only, never the config list (declare one specialization per config to
ship them all). The CLI lists a file's Kernel objects, so it finds those declarations when the underlying kernel
has a module-level name of its own (as `matmul_kernel` in kernels_src/examples/matmul.py, tuned by
`matmul_kernel_autotuned`); with the decorators stacked, the name holds the Autotuner, which the CLI lists only
once its `kernels_in` unwraps `Autotuner.kernel`.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
import uuid
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from minitriton.errors import CompilationError

from . import binder
from .cache import cache_dir, compiler_version, digest
from .jit import VALID_NUM_WARPS, Kernel, interpreting

FORMAT = 1  # bump when the layout of the autotune record changes
DEFAULT_WARMUP = 3  # launches after the first (compiling) one, untimed
DEFAULT_REP = 20  # timed launches; their median is the config's time
# GPU cycles the benchmark keeps the GPU busy for, per timed launch, while the host queues the timed launches
# (~55 us at 1.8 GHz: more than a launch and two event records cost on the host).
SLEEP_CYCLES_PER_LAUNCH = 100_000
# A config failing with these is skipped: compile errors (PtxasError is a CompilationError), too much shared
# memory (the Launcher's RuntimeError), failed launches (CudaError) and CUDA errors torch raises (RuntimeErrors).
# User mistakes (a missing argument, a CPU tensor) are TypeError / ValueError and propagate.
SKIPPABLE_ERRORS = (CompilationError, RuntimeError)
OPTIONS = ("num_warps", "num_stages")
MAX_CACHED_GRIDS = 1024


class AutotuneError(RuntimeError):
    """Every config failed; the message lists why each did."""


class AutotuneWarning(UserWarning):
    """A config failed to compile or launch and was left out of the tuning."""


class Config:
    """Constexpr values for the kernel and, optionally, num_warps / num_stages (None: the kernel's or caller's)."""

    def __init__(self, kwargs: dict[str, Any], num_warps: int | None = None, num_stages: int | None = None):
        if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            raise TypeError(f"mt.Config takes a dict of constexpr names to values, got {kwargs!r}")
        for option in OPTIONS:
            if option in kwargs:
                raise TypeError(f"mt.Config: pass {option} as a keyword (mt.Config({{...}}, {option}=...)), "
                                f"not in the constexpr dict")
        if num_warps is not None and num_warps not in VALID_NUM_WARPS:
            raise ValueError(f"mt.Config: num_warps={num_warps!r}; expected one of "
                             f"{', '.join(map(str, VALID_NUM_WARPS))}")
        if num_stages is not None and (type(num_stages) is not int or num_stages < 1):
            raise ValueError(f"mt.Config: num_stages={num_stages!r}; expected an int >= 1")
        self.kwargs = dict(kwargs)
        self.num_warps = num_warps
        self.num_stages = num_stages
        # What a launch with this config adds to the caller's keywords.
        self.launch_kwargs = dict(self.kwargs)
        for option in OPTIONS:
            if getattr(self, option) is not None:
                self.launch_kwargs[option] = getattr(self, option)

    def all_kwargs(self) -> dict[str, Any]:
        """The constexprs and the options this config sets (Triton's spelling)."""
        return dict(self.launch_kwargs)

    def describe(self) -> str:
        """`BLOCK_M=128 BLOCK_N=128 num_warps=8`: the progress lines and the on-disk record name configs so."""
        return " ".join(f"{k}={v!r}" for k, v in self.launch_kwargs.items()) or "(defaults)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and self.describe() == other.describe()

    def __hash__(self) -> int:
        return hash(self.describe())

    def __repr__(self) -> str:
        return f"Config({self.kwargs!r}, num_warps={self.num_warps!r}, num_stages={self.num_stages!r})"


class ConfigLaunch:
    """One launch of the kernel with one config (what the benchmark function calls)."""

    def __init__(self, launch_fn: Callable[..., None], args: tuple, kwargs: dict[str, Any], config: Config):
        self.launch_fn, self.args, self.kwargs, self.config = launch_fn, args, kwargs, config

    def __call__(self) -> None:
        self.launch_fn(*self.args, **self.kwargs)


def benchmark(launch: Callable[[], Any], warmup: int = DEFAULT_WARMUP, rep: int = DEFAULT_REP) -> float:
    """Median milliseconds of `rep` launches, each between two CUDA events recorded on torch's current stream,
    after one launch that compiles and loads (its errors, and asynchronous ones, surface at the synchronize) and
    `warmup` more. Not host time: the events measure the GPU. A GPU-side sleep queued first keeps the GPU busy
    while the host queues the timed launches, so a short kernel is not charged for the host's launch overhead
    (the gap between one event and the launch behind it). The L2 cache is not flushed between launches."""
    import torch

    launch()
    torch.cuda.synchronize()
    for _ in range(warmup):
        launch()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(SLEEP_CYCLES_PER_LAUNCH * rep)
    for start, end in zip(starts, ends):
        start.record()
        launch()
        end.record()
    ends[-1].synchronize()
    return float(statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)))


def tuning_disabled() -> bool:
    """MINITRITON_AUTOTUNE=0 or MINITRITON_SKIP_AUTOTUNE=1 (read whenever a new key is tuned)."""
    off = ("0", "false", "no", "off")
    return (os.environ.get("MINITRITON_AUTOTUNE", "1").strip().lower() in off
            or os.environ.get("MINITRITON_SKIP_AUTOTUNE", "0").strip().lower() not in off + ("",))


def device_name() -> str:
    """The current GPU's name (part of the on-disk key: a winner on one GPU model says nothing about another)."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name()
    except Exception:  # a broken CUDA setup only makes the record less specific
        pass
    return "no-cuda"


def value_key(value: Any) -> Any:
    """A key argument's part of the tuning key: a tensor by dtype and shape, anything else by value."""
    dtype = getattr(value, "dtype", None)
    shape = getattr(value, "shape", None)
    if dtype is not None and shape is not None:
        return (dtype, tuple(shape))
    return value


def _describe_value(value: Any) -> str:
    dtype = getattr(value, "dtype", None)
    shape = getattr(value, "shape", None)
    if dtype is not None and shape is not None:
        return f"{str(dtype).removeprefix('torch.')}[{', '.join(map(str, shape))}]"
    return repr(value)


def _first_line(error: BaseException) -> str:
    """`CudaError: cuLaunchKernel of ... failed: ...`: the error's type and the first line of its message."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


class Autotuner:
    """An autotuned kernel: launch with `tuner[grid](*args, **kwargs)`; see the module docstring."""

    def __init__(self, kernel: Kernel, configs: Sequence[Config], key: Sequence[str], *,
                 prune_configs_by: Callable[..., Iterable[Config]] | dict | None = None,
                 reset_to_zero: Sequence[str] | None = None, restore_value: Sequence[str] | None = None,
                 warmup: int = DEFAULT_WARMUP, rep: int = DEFAULT_REP, interpret_config: int = 0,
                 do_bench: Callable[..., float] | None = None):
        if isinstance(kernel, Autotuner):
            raise TypeError(f"kernel '{kernel.__name__}' is autotuned twice; give one @mt.autotune all the configs")
        if not isinstance(kernel, Kernel):
            raise TypeError(f"@mt.autotune goes above @mt.kernel (it tunes a kernel), got "
                            f"{type(kernel).__name__} {getattr(kernel, '__name__', '')}".rstrip())
        self.kernel = kernel
        self.__name__ = kernel.__name__
        self.__qualname__ = kernel.__qualname__
        self.__doc__ = kernel.__doc__
        self.__module__ = kernel.__module__
        self.configs = list(configs)
        self.key = key if isinstance(key, str) else list(key)  # a str ("M") is refused by _validate, not split
        self.reset_to_zero = list(reset_to_zero or ())
        self.restore_value = list(restore_value or ())
        self.prune = self._pruner(prune_configs_by)
        self.warmup, self.rep = warmup, rep
        self.interpret_config = interpret_config
        self.do_bench = do_bench
        self._validate()
        self.tuned = [n for n in kernel.arg_names if any(n in c.kwargs for c in self.configs)]
        self.tuned_options = [o for o in OPTIONS if any(getattr(c, o) is not None for c in self.configs)]
        self.best: dict[tuple, Config] = {}  # tuning key -> winner (the launch path's one lookup)
        self.timings: dict[tuple, dict[str, float | None]] = {}  # tuning key -> ms per config (None: failed)
        self._key_of = self._build_key_function()
        self._launch_fns: dict[Any, Callable[..., None]] = {}
        self._lock = threading.RLock()

    # ------------------------------------------------------------------------------------- checks

    def _validate(self) -> None:
        k = self.kernel
        where = f"@mt.autotune of kernel '{k.__name__}'"
        if not self.configs:
            raise ValueError(f"{where}: configs is empty")
        for c in self.configs:
            if not isinstance(c, Config):
                raise TypeError(f"{where}: configs must be mt.Config objects, got {c!r}")
            for name in c.kwargs:
                if name not in k.constexpr_params:
                    kind = "a runtime parameter" if name in k.runtime_params else "not a parameter"
                    raise ValueError(f"{where}: {c!r} sets '{name}', which is {kind}; configs set constexpr "
                                     f"parameters ({', '.join(k.constexpr_params) or 'none'})")
        if isinstance(self.key, str) or not self.key:
            raise ValueError(f"{where}: key must be a non-empty list of parameter names, got {self.key!r}")
        tuned = {n for c in self.configs for n in c.kwargs}
        for name in self.key:
            if name not in k.arg_names:
                raise ValueError(f"{where}: key names '{name}', which is not a parameter "
                                 f"({', '.join(k.arg_names)})")
            if name in tuned:
                raise ValueError(f"{where}: key names '{name}', which the configs set")
        for what, names in (("reset_to_zero", self.reset_to_zero), ("restore_value", self.restore_value)):
            for name in names:
                if name not in k.runtime_params:
                    raise ValueError(f"{where}: {what} names '{name}', which is not a runtime (tensor) parameter "
                                     f"({', '.join(k.runtime_params)})")
        if type(self.interpret_config) is not int or not 0 <= self.interpret_config < len(self.configs):
            raise ValueError(f"{where}: interpret_config={self.interpret_config!r} is not an index into the "
                             f"{len(self.configs)} configs")
        if type(self.warmup) is not int or self.warmup < 0 or type(self.rep) is not int or self.rep < 1:
            raise ValueError(f"{where}: warmup (>= 0) and rep (>= 1) count launches; got {self.warmup!r}, "
                             f"{self.rep!r}")

    def _pruner(self, prune: Any) -> Callable[..., Iterable[Config]] | None:
        if prune is None or callable(prune):
            return prune
        if isinstance(prune, dict) and set(prune) == {"early_config_prune"}:  # Triton's spelling
            return prune["early_config_prune"]
        raise TypeError(f"@mt.autotune of kernel '{self.kernel.__name__}': prune_configs_by is a function "
                        f"(configs, named_args) -> configs (or {{'early_config_prune': fn}}); perf_model and top_k "
                        f"are not supported, got {prune!r}")

    def _build_key_function(self) -> Callable[..., tuple]:
        """exec a function with the kernel's parameter list that returns the tuning key (module docstring)."""
        k = self.kernel
        p = binder._prefix_for(list(k.arg_names) + ["key_of"])
        params = [f"{n}={p}M" if n in self.tuned else f"{n}={p}D[{i}]" for i, n in enumerate(k.arg_names)]
        options = [f"{o}={p}M" if o in self.tuned_options else f"{o}={p}OPTIONS[{o!r}]" for o in k._option_names]
        signature = ", ".join(params + [f"*{p}extra"] + options + [f"**{p}rest"])
        checked = [n for n in k.arg_names if n in self.tuned]
        checked += [o for o in self.tuned_options if o in k._option_names]
        parts = [f"{n} if type({n}) is int else {p}value_key({n})" for n in self.key]
        parts += [f"getattr({n}, 'dtype', None)" for n in k.runtime_params if n not in self.key]
        parts += [o for o in k._option_names if o not in self.tuned_options]
        body = []
        if checked:
            body += [f"if {' or '.join(f'{n} is not {p}M' for n in checked)}:",
                     f"    raise {p}tuner._tuned_argument_error({tuple(checked)!r}, ({', '.join(checked)},))"]
        body.append(f"return ({''.join(f'{part}, ' for part in parts)})")
        source = f"def key_of({signature}):\n" + "".join(f"    {line}\n" for line in body)
        namespace = {f"{p}M": binder.MISSING, f"{p}D": tuple(k.defaults.get(n, binder.MISSING) for n in k.arg_names),
                     f"{p}OPTIONS": dict(k.options), f"{p}value_key": value_key, f"{p}tuner": self}
        exec(compile(source, f"<minitriton autotune key of {k.__name__}>", "exec"), namespace)
        return namespace["key_of"]

    def _tuned_argument_error(self, names: tuple[str, ...], values: tuple) -> TypeError:
        given = [n for n, v in zip(names, values) if v is not binder.MISSING]
        return TypeError(f"autotuned kernel '{self.__name__}' got {', '.join(repr(n) for n in given)}, which "
                         f"@mt.autotune chooses from its configs; leave {'it' if len(given) == 1 else 'them'} out "
                         f"of the launch (a grid callable reads the chosen values from META)")

    # ------------------------------------------------------------------------------------- launch

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        try:
            return self._launch_fns[grid]
        except (KeyError, TypeError):
            pass
        # The lookups are bound once per grid: the kernel's launch function of this grid stays valid
        # (Kernel.clear_cache empties the dicts it reads in place), and so does self.best (cleared in place too).
        key_of, best, kernel_launch, configs = self._key_of, self.best, self.kernel[grid], self.configs

        def launch(*args: Any, **kwargs: Any) -> None:
            key = key_of(*args, **kwargs)
            if interpreting():
                config = configs[self.interpret_config]
            else:
                try:
                    config = best.get(key)
                except TypeError:
                    raise self._unhashable_key(key) from None
                if config is None:
                    config = self._tune(key, grid, args, kwargs)
            kernel_launch(*args, **kwargs, **config.launch_kwargs)

        try:
            if len(self._launch_fns) >= MAX_CACHED_GRIDS:
                self._launch_fns.clear()
            self._launch_fns[grid] = launch
        except TypeError:  # an unhashable grid (a list)
            pass
        return launch

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(f"kernel '{self.__name__}' is launched as {self.__name__}[grid](...), not called directly")

    def run(self, grid: Any, *args: Any, **kwargs: Any) -> None:
        """Launch on `grid` with the best config for these arguments (tuning first if their key is new)."""
        self[grid](*args, **kwargs)

    def _unhashable_key(self, key: tuple) -> TypeError:
        for name, part in zip(self.key, key):
            try:
                hash(part)
            except TypeError:
                return TypeError(f"key argument '{name}' of autotuned kernel '{self.__name__}' = {part!r} is not "
                                 f"hashable")
        return TypeError(f"autotuned kernel '{self.__name__}': an argument of the tuning key is not hashable")

    # ------------------------------------------------------------------------------------- tuning

    def _tune(self, key: tuple, grid: Any, args: tuple, kwargs: dict) -> Config:
        with self._lock:
            config = self.best.get(key)
            if config is not None:  # another thread tuned it meanwhile
                return config
            named = self._named_args(args, kwargs)
            configs = self._pruned(named)
            if tuning_disabled() or len(configs) == 1:
                self.best[key] = configs[0]
                return configs[0]
            record_key = self._record_key(key)
            config = self._from_disk(record_key)
            if config is None:
                config, timings = self._benchmark_all(grid, args, kwargs, named, configs)
                self.timings[key] = timings
                self._store(record_key, config, timings)
            self.best[key] = config
            return config

    def _named_args(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """Every argument by parameter name (defaults included), tuned constexprs left out; the kernel's own
        TypeError for a missing, extra or unknown argument."""
        placeholders = {n: None for n in self.tuned}
        values, _, _ = self.kernel._bind(args, {**kwargs, **placeholders})
        return {n: v for n, v in zip(self.kernel.arg_names, values) if n not in placeholders}

    def _pruned(self, named: dict[str, Any]) -> list[Config]:
        if self.prune is None:
            return self.configs
        configs = list(self.prune(list(self.configs), dict(named)))
        if not configs:
            raise ValueError(f"prune_configs_by of autotuned kernel '{self.__name__}' left no config for "
                             f"{self._describe_key(named)}")
        return configs

    def _describe_key(self, named: dict[str, Any]) -> str:
        return " ".join(f"{n}={_describe_value(named[n])}" for n in self.key)

    def _benchmark_all(self, grid: Any, args: tuple, kwargs: dict, named: dict[str, Any],
                       configs: list[Config]) -> tuple[Config, dict[str, float | None]]:
        label = f"[autotune {self.__name__} {self._describe_key(named)}]"
        bench = self.do_bench or benchmark  # the module attribute, read now: tests replace it
        launch_fn = self.kernel[grid]
        zeroed = [self._tensor(named, n, "reset_to_zero") for n in self.reset_to_zero]
        saved = [(t, t.clone()) for t in (self._tensor(named, n, "restore_value") for n in self.restore_value)]
        timings: dict[str, float | None] = {}
        results: list[tuple[float, Config]] = []
        failures: list[tuple[Config, BaseException]] = []
        started = time.perf_counter()
        try:
            for i, config in enumerate(configs, 1):
                where = f"{label} {i}/{len(configs)} {config.describe()}"
                _reset(zeroed, saved)
                try:
                    ms = float(bench(ConfigLaunch(launch_fn, args, {**kwargs, **config.launch_kwargs}, config),
                                     warmup=self.warmup, rep=self.rep))
                except SKIPPABLE_ERRORS as e:
                    failures.append((config, e))
                    timings[config.describe()] = None
                    _progress(f"{where}: skipped ({_first_line(e)})")
                    warnings.warn(f"autotune {self.__name__}: config {config.describe()} skipped: "
                                  f"{_first_line(e)}", AutotuneWarning, stacklevel=4)
                    continue
                timings[config.describe()] = ms
                results.append((ms, config))
                _progress(f"{where}: {ms:.3f} ms")
        finally:
            _reset(zeroed, saved)  # the caller's launch (or the caller, after an error) sees what it passed
        if not results:
            reasons = "; ".join(f"{c.describe()}: {_first_line(e)}" for c, e in failures)
            raise AutotuneError(f"autotuned kernel '{self.__name__}': every config failed for "
                                f"{self._describe_key(named)} ({reasons})") from failures[0][1]
        ms, best = min(results, key=lambda r: r[0])
        _progress(f"{label} best {best.describe()}: {ms:.3f} ms ({len(results)} of {len(configs)} configs ran, "
                  f"{time.perf_counter() - started:.1f} s)")
        return best, timings

    def _tensor(self, named: dict[str, Any], name: str, what: str) -> Any:
        value = named[name]
        if not (hasattr(value, "zero_") and hasattr(value, "copy_") and hasattr(value, "clone")):
            raise TypeError(f"{what} of autotuned kernel '{self.__name__}' names '{name}', which is "
                            f"{type(value).__name__}, not a tensor")
        return value

    # --------------------------------------------------------------------------------- on disk

    def cache_path(self) -> Path:
        """The record of this kernel's tuning results (module docstring)."""
        from minitriton import compiler

        name = digest([self.kernel.fingerprint(), compiler_version(), compiler.ARCH])
        return cache_dir() / "autotune" / f"{name}.json"

    def _record_key(self, key: tuple) -> str:
        return f"{device_name()}|{','.join(self.key)}|{key!r}"

    def _read_record(self, quiet: bool = False) -> dict[str, Any]:
        """The record's entries; {} when it is missing or corrupt (reported unless quiet)."""
        path = self.cache_path()
        try:
            record = json.loads(path.read_text())
            entries = record["entries"] if isinstance(record, dict) and record.get("format") == FORMAT else None
            if not isinstance(entries, dict) or not all(
                    isinstance(e, dict) and isinstance(e.get("config"), str) for e in entries.values()):
                raise ValueError("not an autotune record of this format")
            return entries
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError) as e:
            if not quiet:
                sys.stderr.write(f"minitriton: autotune cache {path} is corrupt ({e}); ignoring it (the next "
                                 f"tuning rewrites it)\n")
            return {}

    def _from_disk(self, record_key: str) -> Config | None:
        entry = self._read_record().get(record_key)
        if entry is None:
            return None
        by_name = {c.describe(): c for c in self.configs}
        return by_name.get(entry["config"])  # a config since removed from the list: tune again

    def _store(self, record_key: str, config: Config, timings: dict[str, float | None]) -> None:
        """Add this key's winner to the record (re-read first: another process may have added keys)."""
        path = self.cache_path()
        entries = self._read_record(quiet=True)
        entries[record_key] = {"config": config.describe(), "ms": timings[config.describe()], "timings": timings}
        record = {"format": FORMAT, "kernel": self.__name__, "key": self.key, "entries": entries}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
            try:
                temporary.write_text(json.dumps(record, indent=1, sort_keys=True))
                os.replace(temporary, path)
            finally:
                temporary.unlink(missing_ok=True)
        except OSError:  # a read-only cache only costs the next process a tuning
            pass

    # ----------------------------------------------------------------------- the underlying kernel

    @property
    def fn(self) -> Callable:
        return self.kernel.fn

    @property
    def arg_names(self) -> list[str]:
        return self.kernel.arg_names

    @property
    def specializations(self) -> list:
        return self.kernel.specializations

    def specialize(self, signature: str, num_warps: int | None = None, num_stages: int | None = None,
                   name: str | None = None, **constexprs: Any) -> "Autotuner":
        """Declare an AOT specialization on the underlying kernel (the CLI compiles these, not the configs)."""
        self.kernel.specialize(signature, num_warps, num_stages, name, **constexprs)
        return self

    def clear_cache(self) -> None:
        """Forget the winners chosen in this process (the on-disk record stays)."""
        with self._lock:
            self.best.clear()
            self.timings.clear()

    def __repr__(self) -> str:
        return f"<mt.autotune {self.__name__}({', '.join(self.kernel.arg_names)}) over {len(self.configs)} configs>"


def _reset(zeroed: list[Any], saved: list[tuple[Any, Any]]) -> None:
    """reset_to_zero tensors zeroed, restore_value tensors given back their values from before tuning."""
    for tensor in zeroed:
        tensor.zero_()
    for tensor, copy in saved:
        tensor.copy_(copy)


def _progress(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def autotune(configs: Sequence[Config], key: Sequence[str], *,
             prune_configs_by: Callable[..., Iterable[Config]] | dict | None = None,
             reset_to_zero: Sequence[str] | None = None, restore_value: Sequence[str] | None = None,
             warmup: int = DEFAULT_WARMUP, rep: int = DEFAULT_REP, interpret_config: int = 0,
             do_bench: Callable[..., float] | None = None) -> Callable[[Kernel], Autotuner]:
    """`@mt.autotune(configs=[mt.Config(...), ...], key=[...])` above `@mt.kernel` (see the module docstring).

    warmup / rep count launches (not milliseconds); do_bench(launch, warmup=, rep=) -> ms replaces `benchmark`.
    """

    def decorate(kernel: Kernel) -> Autotuner:
        return Autotuner(kernel, configs, key, prune_configs_by=prune_configs_by, reset_to_zero=reset_to_zero,
                         restore_value=restore_value, warmup=warmup, rep=rep, interpret_config=interpret_config,
                         do_bench=do_bench)

    return decorate
