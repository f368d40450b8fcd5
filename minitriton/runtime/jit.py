"""`@mt.kernel` and the Kernel object: `kernel[grid](*args, **constexprs_and_options)`.

How a launch works. `kernel[grid]` returns a launch function generated once per kernel (binder.py), with the
kernel's own parameter list, cached per grid tuple (the grid is validated once, when its function is made). The
function summarises the runtime arguments into a specialization key (dtype and 16-byte alignment of each tensor,
i32/i64, ==1 and %16 of each int, float), looks it up in a dict of launch entries, and on a hit packs the raw values
into the variant's preallocated parameter buffer and calls cuLaunchKernel: no Python-level loop, no allocation
beyond the key tuple, three driver calls (current device, current stream, launch). See binder.py for the steps and
for how each unusual argument leaves that path.

The slow path (`_launch_miss`) runs once per key and device: it recomputes the key in Triton's spelling
(`_specialize`, the readable reference for what the hot path inlines), validates, finds the compiled variant in
memory, else in the on-disk cache (cache.py), else compiles (compiler.py), loads the function and records the entry.

`kernel.prepare(grid, *args, **kwargs)` returns a launch function bound to one variant, grid and device: calling it
with no arguments re-launches the prepared ones (nothing is checked or packed: only the stream and the driver call),
calling it with new runtime arguments checks that they fit the same specialization and launches without binding
or looking anything up (binder.generate_prepared).

MINITRITON_INTERPRET=1 (read at every launch) instead builds the tile IR and runs it on CPU tensors through the
interpreter. `kernel.specialize(signature=..., **constexprs)` declares ahead-of-time specializations for
`minitriton compile`.
"""
from __future__ import annotations

import functools
import inspect
import numbers
import operator
import os
import threading
import types
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from minitriton import compiler  # light: the frontend, passes and codegen load on first compile

from . import binder
from . import driver as _driver
from .cache import DiskCache, compiler_version, digest
from .launcher import PACK_ERRORS, Launcher, ParamBuffer
from .tma import TensorDescriptor
from .fingerprint import source_fingerprint
from .specialize import (ArgSpec, SignatureError, int_code, parse_arg_spec, parse_signature, supported_dtypes,
                         torch_pointer_codes)

OPTION_DEFAULTS = {"num_warps": 4, "num_stages": 3}
GRID_LIMITS = (2**31 - 1, 65535, 65535)
VALID_NUM_WARPS = (1, 2, 4, 8, 16, 32)

# torch.Tensor and {torch dtype: pointer codes}, bound at the first launch so `import minitriton` skips torch.
Tensor: Any = None
POINTER_CODES: dict[Any, tuple[str, str]] = {}
_MISSING = binder.MISSING
# Launch functions kept per kernel, one per grid; beyond this many distinct grids the cache starts over.
MAX_CACHED_GRIDS = 1024


def _load_torch() -> None:
    global Tensor
    import torch

    POINTER_CODES.update(torch_pointer_codes())
    Tensor = torch.Tensor


_INTERPRET_KEY = os.environ.encodekey("MINITRITON_INTERPRET") if hasattr(os.environ, "encodekey") else None
_OFF = (None, b"", b"0", "", "0")


def interpreting() -> bool:
    """MINITRITON_INTERPRET is read at each launch (tests flip it).

    os.environ.get costs about 3 us when the variable is unset (Mapping.get raises and catches a KeyError), more
    than the rest of a launch; reading CPython's underlying dict of encoded variables costs 50 ns.
    """
    data = getattr(os.environ, "_data", None)
    if data is None or _INTERPRET_KEY is None:
        return os.environ.get("MINITRITON_INTERPRET", "0") not in _OFF
    return data.get(_INTERPRET_KEY) not in _OFF


def is_constexpr_annotation(annotation: Any) -> bool:
    """`mt.constexpr` (the class from minitriton.language) or the strings "mt.constexpr" / "constexpr"."""
    if isinstance(annotation, str):
        text = annotation.strip().strip("'\"")  # under `from __future__ import annotations`, "x" is '"x"'
        return text == "constexpr" or text.endswith(".constexpr")
    try:
        from minitriton.language import constexpr
    except ImportError:
        return False
    return annotation is constexpr or (isinstance(constexpr, type) and isinstance(annotation, constexpr))


@dataclass
class AotSpec:
    """An ahead-of-time specialization: runtime argument specs, constexpr values, options and an output name."""

    kernel: "Kernel"
    args: dict[str, ArgSpec]
    constexprs: dict[str, Any]
    num_warps: int
    num_stages: int
    name: str | None = None
    signature: str = ""

    def compile(self, target: str = "cubin", keep_ir: bool = False) -> Any:
        return compiler.compile_kernel(
            self.kernel.fn, {n: s.type for n, s in self.args.items()}, dict(self.constexprs),
            divisibility={n: s.divisibility for n, s in self.args.items()},
            equal_to_one={n for n, s in self.args.items() if s.equal_to_one},
            num_warps=self.num_warps, num_stages=self.num_stages, target=target, keep_ir=keep_ir,
            min_blocks_per_sm=self.kernel.min_blocks_per_sm, **self.kernel.specializing_options())

    def describe(self) -> str:
        """A file-name-safe summary: pointer dtypes then constexpr values (`bf16_BLOCK1024`)."""
        parts: list[str] = []
        for spec in self.args.values():
            code = spec.code.split(":")[0]
            if code.startswith("*") and code[1:] not in parts:
                parts.append(code[1:])
        parts += [f"{k}{v}" for k, v in self.constexprs.items()]
        parts.append(f"w{self.num_warps}")
        text = "_".join(parts)
        return "".join(c if c.isalnum() or c in "_-" else "_" for c in text)


class Kernel:
    """A `@mt.kernel` function. Launch with `kernel[grid](*args, **kwargs)`; see the module docstring."""

    def __init__(self, fn: Callable, *, num_warps: int = 4, num_stages: int = 3, min_blocks_per_sm: int | None = None,
                 warp_specialize: bool = False):
        if not isinstance(fn, types.FunctionType):
            raise TypeError(f"@mt.kernel decorates a Python function, got {type(fn).__name__}")
        self.fn = fn
        functools.update_wrapper(self, fn)  # __name__, __qualname__, __doc__, __module__, __wrapped__
        self.signature = inspect.signature(fn)
        self.file = fn.__code__.co_filename
        self.options = {"num_warps": num_warps, "num_stages": num_stages}
        if min_blocks_per_sm is not None and (not isinstance(min_blocks_per_sm, int) or min_blocks_per_sm < 1):
            raise ValueError(f"@mt.kernel(min_blocks_per_sm=...) takes a positive int, got {min_blocks_per_sm!r}")
        self.min_blocks_per_sm = min_blocks_per_sm  # every variant's .minnctapersm (CUDA's __launch_bounds__)
        self.warp_specialize = bool(warp_specialize)  # TMA rings get a producer warpgroup (passes/warp_specialize.py)
        self.specializations: list[AotSpec] = []
        self._init_params()
        self._variants: dict[tuple, Any] = {}  # specialization key (Triton's spelling) -> Launcher
        self._entries: dict[tuple, tuple] = {}  # the hot path's key -> Launcher.entry (see binder.py)
        self._launch_fns: dict[Any, Callable[..., None]] = {}  # grid -> generated launch function
        self._factory: Callable[..., Callable[..., None]] | None = None  # binder.build_factory, made on first use
        self._interpreted: dict[tuple, tuple[Any, list[int]]] = {}  # key -> (interpreter program, arg positions)
        self._lock = threading.RLock()
        self._fingerprint: str | None = None

    def _init_params(self) -> None:
        self.arg_names: list[str] = []
        self.defaults: dict[str, Any] = {}
        constexpr_flags = []
        for p in self.signature.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.KEYWORD_ONLY, p.POSITIONAL_ONLY):
                raise TypeError(f"kernel '{self.fn.__name__}': parameter '{p.name}' must be a plain parameter "
                                f"(no *args, **kwargs, keyword-only or positional-only parameters)")
            self.arg_names.append(p.name)
            if p.default is not p.empty:
                self.defaults[p.name] = p.default
            constexpr_flags.append(is_constexpr_annotation(p.annotation))
        self.constexpr_params = [n for n, c in zip(self.arg_names, constexpr_flags) if c]
        self.runtime_params = [n for n, c in zip(self.arg_names, constexpr_flags) if not c]
        self._runtime_idx = [i for i, c in enumerate(constexpr_flags) if not c]
        self._constexpr_idx = [i for i, c in enumerate(constexpr_flags) if c]
        self._nparams = len(self.arg_names)
        self._option_names = [o for o in OPTION_DEFAULTS if o not in self.arg_names]
        # The parameters left for keywords once n were given by position, for every n.
        self._names_after = [tuple(self.arg_names[n:]) for n in range(self._nparams + 1)]

    # ----------------------------------------------------------------------------------------- launch

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        try:
            return self._launch_fns[grid]
        except (KeyError, TypeError):  # a new grid, or an unhashable one (a list)
            return self._new_launch_fn(grid)

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(f"kernel '{self.__name__}' is launched as {self.__name__}[grid](...), not called directly")

    def run(self, grid: Any, *args: Any, **kwargs: Any) -> None:
        """Launch on `grid` (a tuple of 1-3 ints, or a callable of the meta-parameters dict returning one)."""
        return self[grid](*args, **kwargs)

    def _new_launch_fn(self, grid: Any) -> Callable[..., None]:
        """Make the launch function of `grid` (validated here, once) and keep it when the grid is hashable.

        A grid equal to a cached one reuses its function: `(1.0,)` after `(1,)` launches grid (1,)."""
        if self._factory is None:
            if Tensor is None:
                _load_torch()
            with self._lock:
                if self._factory is None:
                    self._factory = binder.build_factory(self, Tensor)
        fn = self._factory(None, grid) if callable(grid) else self._factory(self._grid(grid, (), 0, 0), None)
        try:
            if len(self._launch_fns) >= MAX_CACHED_GRIDS:
                self._launch_fns.clear()
            self._launch_fns[grid] = fn
        except TypeError:
            pass
        return fn

    def clear_cache(self) -> None:
        """Forget every in-memory variant, launch entry and launch function (the disk cache stays)."""
        with self._lock:
            for cache in (self._variants, self._entries, self._launch_fns, self._interpreted):
                cache.clear()

    def _launch_miss(self, fast_key: tuple, grid: Any, values: Sequence[Any], num_warps: int, num_stages: int,
                     driver: Any, device: int) -> None:
        """The slow path of a launch whose key has no entry yet (or whose entry belongs to a replaced driver):
        validate, find or build the variant, record its entry under the hot path's key, launch."""
        self._check_complete(values)
        key, raw = self._specialize(values, num_warps, num_stages, device, False)
        gx, gy, gz = self._grid(grid, values, num_warps, num_stages)
        launcher = self._variants.get(key)
        if launcher is None:
            launcher = self._build(key, values, num_warps, num_stages)
        entry = launcher.entry(driver, device)
        self._entries[fast_key] = entry
        fn = entry[1]
        err = launcher.launch(driver.launch, fn, gx, gy, gz, _driver.stream_for(driver, device), raw)
        if err:
            launcher.launch_failed(driver, err, device, (gx, gy, gz), raw)

    def prepare(self, grid: Any, *args: Any, **kwargs: Any) -> Callable[..., None]:
        """Compile (if needed) and bind one variant, grid and the current device; returns its launch function.

        `prepared()` re-launches these arguments (the tensors are kept alive by the function); `prepared(*runtime
        args)` launches new runtime arguments (constexprs and options stay), which must fit the specialization:
        same dtypes, 16-byte alignment where the variant assumes it, ints in the same class (== 1, % 16, i32/i64),
        tensors on the prepared device (ValueError otherwise). A callable grid is evaluated once, here.
        """
        values, num_warps, num_stages, driver, device, key, raw = self._bound("prepare", args, kwargs)
        grid3 = self._grid(grid, values, num_warps, num_stages)
        launcher = self._launcher(key, values, num_warps, num_stages)
        entry = launcher.entry(driver, device)
        own = ParamBuffer(launcher.params.slots)
        try:
            launcher.pack(own.buffer, 0, *raw)
        except PACK_ERRORS as e:
            raise launcher.pack_error(raw, e) from None
        runtime = [values[i] for i in self._runtime_idx]
        dtypes = [a.dtype if isinstance(a, Tensor) else None for a in runtime]
        fn: Any = binder.build_prepared(self, Tensor, key[:len(runtime)], dtypes, driver, device, entry, grid3,
                                        own.address, raw)
        fn.kernel, fn.specialization, fn.grid, fn.device = self, key, grid3, device
        fn.keep_alive = (own, runtime)  # the parameter buffer and the tensors its pointers point into
        return fn

    def resident_programs(self, *args: Any, **kwargs: Any) -> int:
        """How many programs of the variant these arguments select the current device runs at once (blocks per
        SM from the driver's occupancy calculator, times the SMs); compiles the variant if needed, launches
        nothing. For sizing grids to whole waves: a grid of 1.1 waves takes about as long as 2."""
        values, num_warps, num_stages, driver, device, key, _ = self._bound("resident_programs", args, kwargs)
        launcher = self._launcher(key, values, num_warps, num_stages)
        fn = launcher.function(driver, device)
        return driver.resident_blocks(fn, device, launcher.threads, launcher.dynamic_shared)

    def _bound(self, what: str, args: tuple, kwargs: dict) -> tuple:
        """(values, num_warps, num_stages, driver, device, key, raw) of a call of `what` (prepare or
        resident_programs: compiled code on the current device, so not in the interpreter)."""
        if interpreting():
            raise RuntimeError(f"kernel '{self.__name__}'.{what}() needs compiled code; it is not available with "
                               f"MINITRITON_INTERPRET=1 (launch with {self.__name__}[grid](...) instead)")
        values, num_warps, num_stages = self._bind(args, dict(kwargs))
        driver = _driver.get_driver()
        device = driver.current_device()
        key, raw = self._specialize(values, num_warps, num_stages, device, False)
        return values, num_warps, num_stages, driver, device, key, raw

    def _launcher(self, key: tuple, values: Sequence[Any], num_warps: int, num_stages: int) -> Any:
        """The variant's Launcher, compiled (or read from the disk cache) on first use."""
        try:
            launcher = self._variants.get(key)
        except TypeError:
            raise self._unhashable_constexpr(values) from None
        return launcher if launcher is not None else self._build(key, values, num_warps, num_stages)

    def _prepared_mismatch(self, index: int, value: Any, code: str, device: int) -> ValueError:
        name = self.runtime_params[index]
        if isinstance(value, Tensor):
            where = _device_name(value)
            aligned = "16-byte aligned" if value.data_ptr() % 16 == 0 else "not 16-byte aligned"
            got = f"a {str(value.dtype).replace('torch.', '')} tensor on {where}, {aligned}"
        elif type(value) is int:
            try:
                got = f"{value} ({int_code(value)})"
            except ValueError:
                got = f"{value}, beyond 64 bits"
        else:
            got = f"{value!r} ({type(value).__name__})"
        place = f" on cuda:{device}" if device >= 0 else ""
        return ValueError(f"argument '{name}' of the prepared launch of kernel '{self.__name__}' is {got}; it was "
                          f"prepared{place} for {code}. Prepare again for these arguments, or launch with "
                          f"{self.__name__}[grid](...)")

    def _prepared_elsewhere(self, prepared_driver: Any, device: int) -> RuntimeError:
        if _driver.HOT[0] is not prepared_driver:
            return RuntimeError(f"the prepared launch of kernel '{self.__name__}' belongs to a driver that is no "
                                f"longer active (set_driver was called); prepare it again")
        current = _driver.HOT[1]()
        return RuntimeError(f"the prepared launch of kernel '{self.__name__}' was prepared on device {device} but "
                            f"the current device is {current}; launch it inside `with torch.cuda.device({device}):`")

    def _prepared_partial(self, given: Sequence[Any]) -> TypeError:
        missing = [n for n, v in zip(self.runtime_params, given) if v is _MISSING]
        return TypeError(f"the prepared launch of kernel '{self.__name__}' takes all of its runtime arguments "
                         f"({', '.join(self.runtime_params)}) or none; missing {', '.join(map(repr, missing))}")

    def _bad_call(self, values: Sequence[Any], extra: tuple, unknown: dict) -> None:
        """Too many positional arguments, or keywords that name no parameter (the generated function collects
        them in *extra / **unknown only to get here)."""
        if extra:
            raise TypeError(f"kernel '{self.__name__}' takes {self._nparams} arguments "
                            f"({', '.join(self.arg_names)}) but {self._nparams + len(extra)} were given")
        raise self._extra_keyword_error(unknown, self._nparams)

    def _check_complete(self, values: Sequence[Any]) -> None:
        missing = [n for n, v in zip(self.arg_names, values) if v is _MISSING]
        if missing:
            raise TypeError(self._missing_message(missing))

    def _bind(self, args: tuple, kwargs: dict) -> tuple[Sequence[Any], int, int]:
        """Arguments in parameter order, plus the options (TypeError naming the problem parameter). The generic
        binding, for `specialization_key` and `prepare`; launches bind through the generated function."""
        n = len(args)
        options = self.options
        if not kwargs and n == self._nparams:
            return args, options["num_warps"], options["num_stages"]
        if n > self._nparams:
            raise TypeError(f"kernel '{self.__name__}' takes {self._nparams} arguments "
                            f"({', '.join(self.arg_names)}) but {n} were given")
        num_warps, num_stages = options["num_warps"], options["num_stages"]
        if kwargs and self._option_names:
            if "num_warps" in kwargs and "num_warps" in self._option_names:
                num_warps = kwargs.pop("num_warps")
            if "num_stages" in kwargs and "num_stages" in self._option_names:
                num_stages = kwargs.pop("num_stages")
        values = list(args)
        missing = None
        for name in self._names_after[n]:
            v = kwargs.pop(name, _MISSING)
            if v is _MISSING:
                v = self.defaults.get(name, _MISSING)
                if v is _MISSING:
                    missing = (missing or []) + [name]
            values.append(v)
        if kwargs:
            raise self._extra_keyword_error(kwargs, n)
        if missing:
            raise TypeError(self._missing_message(missing))
        return values, num_warps, num_stages

    def _extra_keyword_error(self, kwargs: dict, n_positional: int) -> TypeError:
        name = next(iter(kwargs))
        if name in self.arg_names[:n_positional]:
            return TypeError(f"kernel '{self.__name__}' got argument '{name}' both by position and by keyword")
        known = ", ".join(self.arg_names + self._option_names)
        return TypeError(f"kernel '{self.__name__}' got an unknown keyword argument '{name}'; it takes: {known}")

    def _missing_message(self, missing: list[str]) -> str:
        parts = [f"constexpr '{m}'" if m in self.constexpr_params else f"'{m}'" for m in missing]
        return f"kernel '{self.__name__}' is missing argument(s) {', '.join(parts)}"

    def _specialize(self, values: Sequence[Any], num_warps: int, num_stages: int, device: int,
                    interpret: bool) -> tuple[tuple, list]:
        """The specialization key (Triton's spelling) and the raw slot values (data_ptr for tensors) of the runtime
        arguments, with every check a launch makes. The slow path and `specialization_key` use it; the generated
        launch function (binder.py) inlines the same classification for the common types."""
        if Tensor is None:
            _load_torch()
        key: list[Any] = []
        raw: list[Any] = []
        for i in self._runtime_idx:
            a = values[i]
            t = type(a)
            if t is int:
                if -2147483648 <= a <= 2147483647:
                    key.append("i32=1" if a == 1 else ("i32" if a & 15 else "i32:16"))
                else:
                    key.append(self._int_code(i, a))
                raw.append(a)
            elif t is float:
                key.append("fp32")
                raw.append(a)
            elif t is bool:
                key.append("i1")
                raw.append(a)
            elif isinstance(a, Tensor):
                if a.get_device() != device:
                    raise self._device_error(i, values, device, interpret)
                ptr = a.data_ptr()
                codes = POINTER_CODES.get(a.dtype)
                if codes is None:
                    raise TypeError(f"argument '{self.arg_names[i]}' of kernel '{self.__name__}' has dtype "
                                    f"{a.dtype}, which kernels do not take; supported: {supported_dtypes()}")
                key.append(codes[not ptr & 15])
                raw.append(ptr)
            else:
                code, value = self._other_argument(i, a, values)
                key.append(code)
                raw.append(value)
        for i in self._constexpr_idx:
            key.append(values[i])
        key.append(num_warps)
        key.append(num_stages)
        return tuple(key), raw

    def specialization_key(self, *args: Any, **kwargs: Any) -> tuple:
        """The key a launch with these arguments compiles and caches under (printable: Triton-style codes for
        runtime arguments, then the constexpr values, num_warps and num_stages)."""
        values, num_warps, num_stages = self._bind(args, dict(kwargs))
        return self._key_of(values, num_warps, num_stages)

    def _key_of(self, values: Sequence[Any], num_warps: int, num_stages: int) -> tuple:
        """The specialization key of bound arguments, on the device their tensors are on (-1: the CPU)."""
        if Tensor is None:
            _load_torch()
        devices = [getattr(values[i], "tensor", values[i]).get_device() for i in self._runtime_idx
                   if isinstance(values[i], (Tensor, TensorDescriptor))]
        return self._specialize(values, num_warps, num_stages, devices[0] if devices else -1, False)[0]

    def precompile(self, *args: Any, **kwargs: Any) -> Any:
        """Compile the variant a launch with these arguments would select into the disk cache, and launch nothing;
        returns its CompiledKernel. Works without a GPU on CPU (or meta) tensors: the key depends on the arguments'
        dtypes, 16-byte alignment and int classes, not on their device, so a cache filled on a machine with the
        same ptxas serves launches elsewhere (tools/prebuild_cache.py)."""
        values, num_warps, num_stages = self._bind(args, dict(kwargs))
        return self._launcher(self._key_of(values, num_warps, num_stages), values, num_warps, num_stages).compiled

    def _int_code(self, index: int, value: int) -> str:
        try:
            return int_code(value)
        except ValueError:
            raise ValueError(f"argument '{self.arg_names[index]}' of kernel '{self.__name__}' = {value} does not "
                             f"fit in a 64-bit integer") from None

    def _other_argument(self, index: int, a: Any, values: Sequence[Any]) -> tuple[str, Any]:
        """bools, numpy scalars and other number types; anything else is a TypeError naming the parameter (or
        every missing one, when `a` was not given)."""
        if a is _MISSING:
            self._check_complete(values)
        name = self.arg_names[index]
        if type(a) is TensorDescriptor:  # the Launcher packs its 128-byte tensor map (runtime/tma.py)
            return a.code, a
        if type(a) is bool:
            return "i1", a
        if type(a).__module__ == "numpy" and type(a).__name__ in ("bool", "bool_"):
            return "i1", bool(a)
        if isinstance(a, numbers.Integral):
            value = operator.index(a)
            return self._int_code(index, value), value
        if isinstance(a, numbers.Real):
            return "fp32", float(a)
        what = "None" if a is None else f"a {type(a).__module__}.{type(a).__qualname__}"
        raise TypeError(f"argument '{name}' of kernel '{self.__name__}' is {what}; runtime arguments are torch "
                        f"tensors, mt.TensorDescriptors, ints, floats or bools (annotate it `: mt.constexpr` to pass "
                        f"it at compile time)")

    def _device_error(self, index: int, values: Sequence[Any], device: int, interpret: bool) -> ValueError:
        name, tensor = self.arg_names[index], values[index]
        where = f"kernel '{self.__name__}'"
        if interpret:
            return ValueError(f"argument '{name}' of {where} is a tensor on {_device_name(tensor)}; "
                              f"MINITRITON_INTERPRET=1 runs kernels on the CPU and needs CPU tensors")
        if tensor.get_device() < 0:
            return ValueError(f"argument '{name}' of {where} is a CPU tensor; a GPU launch needs CUDA tensors "
                              f"(or set MINITRITON_INTERPRET=1 to run the kernel on the CPU)")
        tensors = [(self.arg_names[i], values[i]) for i in self._runtime_idx if isinstance(values[i], Tensor)]
        if len({t.get_device() for _, t in tensors}) > 1:
            placed = ", ".join(f"'{n}' on {_device_name(t)}" for n, t in tensors)
            return ValueError(f"the tensors passed to {where} are on different devices: {placed}")
        return ValueError(f"argument '{name}' of {where} is on {_device_name(tensor)} but the current device is "
                          f"cuda:{device}; launch inside `with torch.cuda.device({tensor.get_device()}):`")

    def _unhashable_constexpr(self, values: Sequence[Any]) -> TypeError:
        for i in self._constexpr_idx:
            try:
                hash(values[i])
            except TypeError:
                return TypeError(f"constexpr '{self.arg_names[i]}' of kernel '{self.__name__}' = {values[i]!r} "
                                 f"is not hashable; pass a tuple instead of a list")
        return TypeError(f"kernel '{self.__name__}': an argument is not hashable")

    def _grid(self, grid: Any, values: Sequence[Any], num_warps: int, num_stages: int) -> tuple[int, int, int]:
        """(gx, gy, gz) from a tuple or a callable of the meta-parameters; ValueError beyond the hardware limits."""
        if type(grid) is tuple and len(grid) == 1:  # the common case, checked in a few comparisons
            gx = grid[0]
            if type(gx) is int and 0 < gx <= 2147483647:
                return gx, 1, 1
        if callable(grid):
            meta = dict(zip(self.arg_names, values))
            meta["num_warps"], meta["num_stages"] = num_warps, num_stages
            grid = grid(meta)
        if type(grid) is tuple and 0 < len(grid) <= 3:
            dims = grid
        elif isinstance(grid, (tuple, list)) and 0 < len(grid) <= 3:
            dims = tuple(grid)
        elif isinstance(grid, numbers.Integral):
            dims = (grid,)
        else:
            raise ValueError(f"grid of kernel '{self.__name__}' must be a tuple of 1 to 3 positive ints (or a "
                             f"callable returning one), got {grid!r}")
        gx = dims[0]
        gy = dims[1] if len(dims) > 1 else 1
        gz = dims[2] if len(dims) > 2 else 1
        if type(gx) is not int or type(gy) is not int or type(gz) is not int:
            gx, gy, gz = self._grid_ints(dims, gx, gy, gz)
        if not (0 < gx <= 2147483647 and 0 < gy <= 65535 and 0 < gz <= 65535):
            raise ValueError(self._grid_message(dims))
        return gx, gy, gz

    def _grid_ints(self, dims: tuple, *xyz: Any) -> tuple[int, int, int]:
        try:
            return tuple(operator.index(d) for d in xyz)  # type: ignore[return-value]
        except TypeError:
            raise ValueError(f"grid of kernel '{self.__name__}' must hold ints, got {dims!r}") from None

    def _grid_message(self, dims: tuple) -> str:
        for axis, (d, limit) in enumerate(zip(dims, GRID_LIMITS)):
            if not 0 < d <= limit:
                return (f"grid of kernel '{self.__name__}' is {dims}: dimension {'xyz'[axis]} = {d} must be between "
                        f"1 and {limit}")
        return f"grid of kernel '{self.__name__}' is {dims}"

    # ------------------------------------------------------------------------------------- compiling

    def _build(self, key: tuple, values: Sequence[Any], num_warps: int, num_stages: int) -> Any:
        """Slow path of a launch: from the disk cache or the compiler, then a Launcher kept under `key`."""
        with self._lock:
            launcher = self._variants.get(key)
            if launcher is not None:
                return launcher
            specs, constexprs = self._decode_key(key, values, num_warps, num_stages)
            disk = DiskCache()
            cache_key = self.cache_key(specs, constexprs, num_warps, num_stages)
            compiled = disk.load(cache_key)
            if compiled is None:
                compiled = compiler.compile_kernel(
                    self.fn, {n: s.type for n, s in specs.items()}, constexprs,
                    divisibility={n: s.divisibility for n, s in specs.items()},
                    equal_to_one={n for n, s in specs.items() if s.equal_to_one},
                    num_warps=num_warps, num_stages=num_stages, target="cubin",
                    min_blocks_per_sm=self.min_blocks_per_sm, **self.specializing_options())
                disk.store(cache_key, compiled)
            launcher = Launcher(compiled, self.runtime_params)
            self._variants[key] = launcher
            return launcher

    def _decode_key(self, key: tuple, values: Sequence[Any], num_warps: int,
                    num_stages: int) -> tuple[dict[str, ArgSpec], dict[str, Any]]:
        if num_warps not in VALID_NUM_WARPS:
            raise ValueError(f"num_warps of kernel '{self.__name__}' is {num_warps!r}; expected one of "
                             f"{', '.join(map(str, VALID_NUM_WARPS))}")
        if type(num_stages) is not int or num_stages < 1:
            raise ValueError(f"num_stages of kernel '{self.__name__}' is {num_stages!r}; expected an int >= 1")
        specs = {n: parse_arg_spec(code) for n, code in zip(self.runtime_params, key)}
        constexprs = {self.arg_names[i]: values[i] for i in self._constexpr_idx}
        return specs, constexprs

    def cache_key(self, specs: dict[str, ArgSpec], constexprs: dict[str, Any], num_warps: int,
                  num_stages: int) -> str:
        """The on-disk key: compiler version, kernel + helper sources, specialization, constexprs, options."""
        parts = [compiler_version(), compiler.ARCH, self.fingerprint(), f"num_warps={num_warps}", f"num_stages={num_stages}"]
        if self.min_blocks_per_sm:
            parts.append(f"min_blocks_per_sm={self.min_blocks_per_sm}")
        if self.warp_specialize:
            parts.append("warp_specialize")
        parts += [f"{n}:{s.code}" for n, s in specs.items()]
        parts += [f"{n}={type(v).__module__}.{type(v).__qualname__}:{v!r}" for n, v in constexprs.items()]
        return digest(parts)

    def specializing_options(self) -> dict[str, Any]:
        """compile_kernel options beyond the launch options, passed only when set (the compiler's defaults stay)."""
        return {"warp_specialize": True} if self.warp_specialize else {}

    def fingerprint(self) -> str:
        """sha256 of the kernel's source, the helpers it calls and the module-level constants it reads."""
        if self._fingerprint is None:
            self._fingerprint = source_fingerprint(self.fn)
        return self._fingerprint

    @property
    def source(self) -> str:
        return inspect.getsource(self.fn)

    # --------------------------------------------------------------------------------- interpreting

    def _run_interpreted(self, grid: Any, values: Sequence[Any], num_warps: int, num_stages: int) -> None:
        """Build the tile IR (canonicalize only) once per key and run it on CPU tensors in the interpreter.

        The interpreter takes the kernel's IR arguments in order: runtime parameters, including those equal to 1
        (the frontend folds their value but keeps them in the signature), matched by name."""
        self._check_complete(values)
        key, _ = self._specialize(values, num_warps, num_stages, -1, True)
        grid3 = self._grid(grid, values, num_warps, num_stages)
        try:
            entry = self._interpreted.get(key)
        except TypeError:
            raise self._unhashable_constexpr(values) from None
        if entry is None:
            entry = self._build_interpreted(key, values, num_warps, num_stages)
        run_program, positions = entry
        run_program(grid3, [values[i] for i in positions])

    def _build_interpreted(self, key: tuple, values: Sequence[Any], num_warps: int,
                           num_stages: int) -> tuple[Any, list[int]]:
        specs, constexprs = self._decode_key(key, values, num_warps, num_stages)
        module, _ = compiler.build_ir(
            self.fn, {n: s.type for n, s in specs.items()}, constexprs,
            divisibility={n: s.divisibility for n, s in specs.items()},
            equal_to_one={n for n, s in specs.items() if s.equal_to_one},
            num_warps=num_warps, num_stages=num_stages, pipeline=compiler.INTERPRET_PIPELINE)
        from minitriton.interpreter import compile_function

        func = module.functions[0]
        names = func.attrs.get("arg_names") or self.runtime_params
        positions = [self.arg_names.index(n) for n in names]
        entry = (compile_function(func), positions)  # compiled once, run at every launch of this key
        self._interpreted[key] = entry
        return entry

    # ----------------------------------------------------------------------------- ahead of time

    def aot_spec(self, signature: str, num_warps: int | None = None, num_stages: int | None = None,
                 name: str | None = None, **constexprs: Any) -> AotSpec:
        """An ahead-of-time specialization (not recorded); SignatureError on unknown types or parameters."""
        args = parse_signature(signature, self.runtime_params, self.constexpr_params)
        for k in constexprs:
            if k not in self.constexpr_params:
                kind = "a runtime parameter: give its type in the signature" if k in self.runtime_params else \
                    f"not a parameter of kernel '{self.__name__}'"
                raise SignatureError(f"'{k}' is {kind} (constexpr parameters: "
                                     f"{', '.join(self.constexpr_params) or 'none'})")
        values = {n: constexprs[n] if n in constexprs else self.defaults.get(n, inspect.Parameter.empty)
                  for n in self.constexpr_params}
        missing = [n for n, v in values.items() if v is inspect.Parameter.empty]
        if missing:
            raise SignatureError(f"kernel '{self.__name__}' needs a value for constexpr(s) {', '.join(missing)}")
        nw = self.options["num_warps"] if num_warps is None else num_warps
        ns = self.options["num_stages"] if num_stages is None else num_stages
        if nw not in VALID_NUM_WARPS:
            raise SignatureError(f"num_warps={nw!r}; expected one of {', '.join(map(str, VALID_NUM_WARPS))}")
        return AotSpec(self, args, values, nw, ns, name, signature)

    def specialize(self, signature: str, num_warps: int | None = None, num_stages: int | None = None,
                   name: str | None = None, **constexprs: Any) -> "Kernel":
        """Declare an AOT specialization (compiled by `minitriton compile FILE.py`); returns the kernel."""
        self.specializations.append(self.aot_spec(signature, num_warps, num_stages, name, **constexprs))
        return self

    def __repr__(self) -> str:
        return f"<mt.kernel {self.__name__}({', '.join(self.arg_names)})>"


def kernel(fn: Callable | None = None, *, num_warps: int = 4, num_stages: int = 3,
           min_blocks_per_sm: int | None = None, warp_specialize: bool = False) -> Any:
    """`@mt.kernel` or `@mt.kernel(num_warps=8, num_stages=4, min_blocks_per_sm=2)`: make a launchable Kernel of a
    Python function. min_blocks_per_sm asks ptxas to fit that many programs on an SM (it caps registers).
    warp_specialize=True (off by default, not yet run on a GPU): a TMA-fed wgmma ring loop gets a producer
    warpgroup issuing the TMA copies next to the num_warps consumer warps (passes/warp_specialize.py); the
    launch then has num_warps + 4 warps."""
    options = dict(num_warps=num_warps, num_stages=num_stages, min_blocks_per_sm=min_blocks_per_sm,
                   warp_specialize=warp_specialize)
    if fn is None:
        return lambda f: Kernel(f, **options)  # type: ignore[arg-type]
    return Kernel(fn, **options)  # type: ignore[arg-type]


def _device_name(tensor: Any) -> str:
    index = tensor.get_device()
    return f"cuda:{index}" if index >= 0 else "cpu"
