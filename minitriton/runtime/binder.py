"""The launch hot path: one Python function per kernel, generated from source text with exec (as Triton does).

`kernel[grid]` returns a function whose parameter list is the kernel's own (`add(x, y, out, n, BLOCK)`) plus the
keyword-only options `num_warps` / `num_stages`, so the interpreter binds the arguments and the body reads each one
as a local variable. For every runtime parameter the body inlines a type dispatch (exact types first: `type(x) is
int` costs ~10 ns where isinstance(an int, torch.Tensor) costs ~100) that yields the raw value and the key parts:

    int     raw value the int; key part "i32" / "i32:16" / "i32=1" (i64 and errors through Kernel._int_code)
    tensor  raw value data_ptr(); key parts (dtype, 16-byte aligned?); device checked against the current device
    float   raw value the float; key part "fp32"
    other   Kernel._other_argument: numpy scalars, bools, descriptors, and the error for None / str / a missing
            argument

The key is one flat tuple (device, two parts per runtime parameter, constexpr values, num_warps, num_stages),
looked up in the kernel's dict of launch entries. An entry (built once per key and device by the slow path,
Kernel._launch_miss) holds everything the launch needs: the function handle, the variant's struct packer and
parameter buffer, block size, shared memory and the thread that owns the buffer. A hit then costs: the current
stream (mapped to a CUstream object by the driver's `streams` dict), one `struct.pack_into` into the preallocated
buffer and the driver's cuLaunchKernel.

Everything unusual leaves the hot path for a method of Kernel that gives the readable error or does the work:
too many positional arguments or unknown keywords (`*extra`, `**unknown` are collected only to detect them), a
missing argument (parameters without a default default to MISSING, which falls into the `other` branch or into
the key, where it misses), an unknown dtype or bad options (a key miss: the slow path validates before
compiling), an unhashable constexpr (TypeError from the lookup), MINITRITON_INTERPRET=1 (one dict read per
launch: the flag is read at every launch because tests flip it), a driver swapped by `set_driver`. An argument
given both by position and by keyword is Python's own TypeError (`add() got multiple values for argument 'n'`).

`generate_prepared` writes the function that `Kernel.prepare` returns: the same steps for one known variant, with
the key computation replaced by checks that the new arguments fit it.

CPython compiles the generated source in ~1 ms per kernel, which is most of a first launch from the disk cache;
the code object is therefore kept too: `$MINITRITON_CACHE_DIR/launchers/<sha256 of source and Python>.marshal`,
written atomically (temporary file, os.replace), loaded with marshal in ~30 us, recompiled if unreadable.

Locals of the generated code carry a prefix (`_mt_`, lengthened if a parameter starts with it) so that kernel
parameter names can never clash with them. `generate(..., stop_after=STAGE)` ends the function after a stage:
tools/launch_profile.py times the cumulative stages that way.
"""
from __future__ import annotations

import keyword
import linecache
import marshal
import os
import sys
import threading
import types
import uuid
from typing import Any, Callable, Sequence

from . import driver as _driver
from .cache import cache_dir, digest
from .launcher import PACK_ERRORS


class _Missing:
    """The default of kernel parameters that have none: a launch that leaves one unset takes the slow path."""

    def __repr__(self) -> str:
        return "<missing argument>"


MISSING = _Missing()

# The cumulative stages of a launch, in order (for `stop_after`).
STAGES = ("bind", "interpret", "device", "arguments", "lookup", "grid", "stream", "pack", "launch")

_ENV_KEY = os.environ.encodekey("MINITRITON_INTERPRET") if hasattr(os.environ, "encodekey") else None
_ENV_DATA = getattr(os.environ, "_data", None)


def _environment_getter() -> Callable[[Any], Any]:
    """A C-level getter answering None when MINITRITON_INTERPRET is unset (`os.environ.get` costs ~1 us when the
    variable is unset: Mapping.get raises and catches a KeyError; CPython's underlying dict answers in ~30 ns)."""
    if isinstance(_ENV_DATA, dict) and _ENV_KEY is not None:
        return _ENV_DATA.get
    return lambda key: os.environ.get("MINITRITON_INTERPRET")


def function_name(kernel: Any) -> str:
    """The kernel's name when it is a usable identifier (Python's own binding errors then read `add() ...`)."""
    name = kernel.__name__
    return name if name.isidentifier() and not keyword.iskeyword(name) else "kernel"


def _prefix_for(names: Sequence[str]) -> str:
    prefix = "_mt_"
    while any(n.startswith(prefix) for n in names):
        prefix = "_" + prefix
    return prefix


def generate(kernel: Any, stop_after: str | None = None) -> str:
    """The source of a factory `make(grid, grid_fn)` returning the launch function of `kernel` for one grid:
    `grid` a validated (gx, gy, gz), or `grid_fn` a function of the meta-parameters, evaluated at each launch
    after the lookup (when the arguments are known to be complete and valid)."""
    names = list(kernel.arg_names)
    p = _prefix_for(names + [function_name(kernel)])
    runtime = set(kernel.runtime_params)
    values = "(" + "".join(f"{n}, " for n in names) + ")"
    params = [f"{n}={p}D[{i}]" for i, n in enumerate(names)]
    extra = f"*{p}extra"
    options = [f"{o}={p}OPTIONS[{o!r}]" for o in kernel._option_names]
    signature = ", ".join(params + [extra] + options + [f"**{p}unknown"])
    nw = "num_warps" if "num_warps" in kernel._option_names else f"{p}OPTIONS['num_warps']"
    ns = "num_stages" if "num_stages" in kernel._option_names else f"{p}OPTIONS['num_stages']"

    body: list[str] = []
    emit = body.append

    def stop(stage: str) -> bool:
        if stop_after == stage:
            emit("return None")
            return True
        return False

    emit(f"if {p}extra or {p}unknown:")
    emit(f"    return {p}kernel._bad_call({values}, {p}extra, {p}unknown)")
    if stop("bind"):
        return _wrap(kernel, p, signature, body)
    emit(f"if {p}env_get({p}ENV_KEY) is not None and {p}interpreting():")
    emit(f"    return {p}kernel._run_interpreted({p}grid_spec, {values}, {nw}, {ns})")
    if stop("interpret"):
        return _wrap(kernel, p, signature, body)
    emit(f"{p}drv, {p}current_device, {p}current_stream, {p}streams, {p}launch = {p}HOT")
    emit(f"if {p}drv is None:")
    emit(f"    {p}drv, {p}current_device, {p}current_stream, {p}streams, {p}launch = {p}activate()")
    emit(f"{p}device = {p}current_device()")
    if stop("device"):
        return _wrap(kernel, p, signature, body)
    raw: list[str] = []
    key = [f"{p}device"]
    for i, name in enumerate(names):
        if name not in runtime:
            continue
        v, k, a = f"{p}v{i}", f"{p}k{i}", f"{p}a{i}"
        raw.append(v)
        key += [k, a]
        # Exact types first: isinstance(an int, torch.Tensor) takes CPython's slow path (~100 ns, it looks up
        # __class__ and walks __bases__); `type(x) is T` costs ~10 ns. Tensor subclasses take the isinstance test.
        emit(f"{p}t = type({name})")
        emit(f"if {p}t is int:")
        emit(f"    {v} = {name}")
        emit(f"    {a} = None")
        emit(f"    if -2147483648 <= {name} <= 2147483647:")
        emit(f"        {k} = 'i32=1' if {name} == 1 else ('i32' if {name} & 15 else 'i32:16')")
        emit(f"    else:")
        emit(f"        {k} = {p}kernel._int_code({i}, {name})")
        emit(f"elif {p}t is {p}Tensor or {p}t is not float and isinstance({name}, {p}Tensor):")
        emit(f"    {v} = {name}.data_ptr()")
        emit(f"    if {name}.get_device() != {p}device:")
        emit(f"        raise {p}kernel._device_error({i}, {values}, {p}device, False)")
        emit(f"    {k} = {name}.dtype")
        emit(f"    {a} = not {v} & 15")
        emit(f"elif {p}t is float:")
        emit(f"    {v} = {name}")
        emit(f"    {k} = 'fp32'")
        emit(f"    {a} = None")
        emit(f"else:")
        emit(f"    {k}, {v} = {p}kernel._other_argument({i}, {name}, {values})")
        emit(f"    {a} = None")
    if stop("arguments"):
        return _wrap(kernel, p, signature, body)
    key += [n for n in names if n not in runtime] + [nw, ns]
    emit(f"{p}key = ({', '.join(key)},)")
    emit(f"try:")
    emit(f"    {p}entry = {p}entries[{p}key]")
    emit(f"except KeyError:")
    emit(f"    return {p}kernel._launch_miss({p}key, {p}grid_spec, {values}, {nw}, {ns}, {p}drv, {p}device)")
    emit(f"except TypeError:")
    emit(f"    raise {p}kernel._unhashable_constexpr({values}) from None")
    emit(f"{p}edrv, {p}fn, {p}pack, {p}buffer, {p}params, {p}threads, {p}smem, {p}owner, {p}variant, {p}flags = "
         f"{p}entry")
    emit(f"if {p}edrv is not {p}drv:")
    emit(f"    return {p}kernel._launch_miss({p}key, {p}grid_spec, {values}, {nw}, {ns}, {p}drv, {p}device)")
    if stop("lookup"):
        return _wrap(kernel, p, signature, body)
    emit(f"if {p}grid_fn is None:")
    emit(f"    {p}gx, {p}gy, {p}gz = {p}grid")
    emit(f"else:")
    emit(f"    {p}gx, {p}gy, {p}gz = {p}kernel._grid({p}grid_fn, {values}, {nw}, {ns})")
    if stop("grid"):
        return _wrap(kernel, p, signature, body)
    emit(f"{p}stream = {p}streams[{p}current_stream({p}device)]")
    if stop("stream"):
        return _wrap(kernel, p, signature, body)
    raw_args = ", ".join(raw)
    raw_list = f"[{raw_args}]"
    grid3 = f"{p}gx, {p}gy, {p}gz"
    launch = f"{p}launch({p}fn, {grid3}, {p}threads, 1, 1, {p}smem, {p}stream, {p}params, {p}flags)[0]"
    if raw:
        # The owner thread packs the variant's own buffer without a lock: no other thread ever writes it (others
        # go through Launcher.launch_shared, which packs a second buffer under a lock).
        emit(f"if {p}get_ident() == {p}owner:")
        emit(f"    try:")
        emit(f"        {p}pack({p}buffer, 0, {raw_args})")
        emit(f"    except {p}PACK_ERRORS as {p}error:")
        emit(f"        raise {p}variant.pack_error({raw_list}, {p}error) from None")
        if stop("pack"):
            return _wrap(kernel, p, signature, body)
        emit(f"    {p}err = {launch}")
        emit(f"else:")
        emit(f"    {p}err = {p}variant.launch_shared({p}launch, {p}fn, {grid3}, {p}stream, {raw_list})")
    else:  # nothing to pack, nothing to race on: any thread launches the (empty) parameter list directly
        if stop("pack"):
            return _wrap(kernel, p, signature, body)
        emit(f"{p}err = {launch}")
    emit(f"if {p}err:")
    emit(f"    {p}variant.launch_failed({p}drv, {p}err, {p}device, ({grid3}), {raw_list})")
    return _wrap(kernel, p, signature, body)


def _wrap(kernel: Any, p: str, signature: str, body: list[str]) -> str:
    name = function_name(kernel)
    lines = [f"def {p}make({p}grid, {p}grid_fn):", f"    {p}grid_spec = {p}grid if {p}grid_fn is None else {p}grid_fn",
             f"    def {name}({signature}):"]
    lines += ["        " + line for line in body]
    # Python's own binding errors name the function by its __qualname__: `add() got multiple values for ...`.
    lines.append(f"    {name}.__qualname__ = {kernel.__name__!r}")
    lines.append(f"    return {name}")
    return "\n".join(lines) + "\n"


def compile_cached(source: str, filename: str) -> types.CodeType:
    """compile(source, filename, "exec") through the code-object cache described in the module docstring."""
    path = cache_dir() / "launchers" / f"{digest([sys.implementation.cache_tag, filename, source])}.marshal"
    try:
        code = marshal.loads(path.read_bytes())
        if isinstance(code, types.CodeType) and code.co_filename == filename:
            return code
    except (OSError, ValueError, EOFError, TypeError):
        pass
    code = compile(source, filename, "exec")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        try:
            temporary.write_bytes(marshal.dumps(code))
            os.replace(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)  # gone after a successful replace
    except OSError:  # a read-only or full disk only costs the next process a compile
        pass
    return code


def build_factory(kernel: Any, tensor_type: type, stop_after: str | None = None) -> Callable[..., Callable[..., None]]:
    """exec the generated source; returns `make(grid, grid_fn)`."""
    if stop_after is not None and stop_after not in STAGES:
        raise ValueError(f"unknown stage {stop_after!r}; stages: {', '.join(STAGES)}")
    source = generate(kernel, stop_after)
    p = _prefix_for(list(kernel.arg_names) + [function_name(kernel)])
    from .jit import interpreting

    namespace = {
        f"{p}kernel": kernel,
        f"{p}D": tuple(kernel.defaults.get(n, MISSING) for n in kernel.arg_names),
        f"{p}OPTIONS": dict(kernel.options),
        f"{p}entries": kernel._entries,
        f"{p}Tensor": tensor_type,
        f"{p}env_get": _environment_getter(),
        f"{p}ENV_KEY": _ENV_KEY,
        f"{p}interpreting": interpreting,
        f"{p}HOT": _driver.HOT,
        f"{p}activate": _driver.activate,
        f"{p}get_ident": threading.get_ident,
        f"{p}PACK_ERRORS": PACK_ERRORS,
    }
    filename = f"<minitriton launch of {kernel.__name__}{' (up to ' + stop_after + ')' if stop_after else ''}>"
    exec(compile_cached(source, filename), namespace)
    # Tracebacks through the generated function show its source.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return namespace[f"{p}make"]


# ------------------------------------------------------------------------------------------ prepared launches


def _fits(p: str, name: str, code: str, index: int) -> list[str]:
    """Statements that check runtime argument `name` against its specialization `code` and bind its raw value
    to `{p}v{index}`: a mismatch raises through Kernel._prepared_mismatch (which says why)."""
    v = f"{p}v{index}"
    fail = f"raise {p}kernel._prepared_mismatch({index}, {name}, {code!r}, {p}device)"
    base, _, div = code.partition(":")
    equal_to_one = base.endswith("=1")
    base = base.removesuffix("=1")
    if base.startswith("*"):
        aligned = f" or {v} & 15" if div == "16" else ""
        return [f"if not isinstance({name}, {p}Tensor):", f"    {fail}",
                f"{v} = {name}.data_ptr()",
                f"if {name}.get_device() != {p}device or {name}.dtype is not {p}DTYPES[{index}]{aligned}:",
                f"    {fail}"]
    if base in ("i32", "i64"):
        low, high = (-(2**31), 2**31 - 1) if base == "i32" else (-(2**63), 2**63 - 1)
        test = f"{name} != 1" if equal_to_one else f"not {low} <= {name} <= {high}" + (
            f" or {name} & 15" if div == "16" else "")
        return [f"if type({name}) is not int or {test}:", f"    {fail}", f"{v} = {name}"]
    if base == "fp32":
        return [f"if type({name}) is not float and type({name}) is not int:", f"    {fail}", f"{v} = {name}"]
    if base == "i1":
        return [f"if type({name}) is not bool:", f"    {fail}", f"{v} = {name}"]
    # Descriptors and other scalar types (numpy scalars): the generic classification decides.
    return [f"if {p}kernel._other_argument({p}kernel.arg_names.index({name!r}), {name}, ())[0] != {code!r}:",
            f"    {fail}", f"{v} = {name}"]


def generate_prepared(kernel: Any, codes: Sequence[str]) -> str:
    """The source of `make(...)` returning a prepared launch function of one variant (Kernel.prepare).

    The function takes the kernel's runtime parameters. With none it re-launches the arguments given to prepare
    from its own parameter buffer, packed once (nothing is packed, so threads may share it). With all of them it
    checks that each fits the variant's specialization (dtype, alignment, device; int range, % 16, == 1) and
    packs and launches as the hot path does.
    """
    names = list(kernel.runtime_params)
    p = _prefix_for(list(kernel.arg_names) + [function_name(kernel)])
    signature = ", ".join(f"{n}={p}M" for n in names)
    missing_test = " and ".join(f"{n} is {p}M" for n in names) or "True"
    given = "(" + "".join(f"{n}, " for n in names) + ")"
    body = [
        f"{p}drv, {p}current_device, {p}current_stream, {p}streams, {p}launch = {p}HOT",
        f"if {p}drv is not {p}pdrv or {p}current_device() != {p}device:",
        f"    raise {p}kernel._prepared_elsewhere({p}pdrv, {p}device)",
        f"if {missing_test}:",
        f"    {p}err = {p}launch({p}fn, {p}gx, {p}gy, {p}gz, {p}threads, 1, 1, {p}smem, "
        f"{p}streams[{p}current_stream({p}device)], {p}own_params, {p}flags)[0]",
        f"    if {p}err:",
        f"        {p}variant.launch_failed({p}drv, {p}err, {p}device, ({p}gx, {p}gy, {p}gz), {p}own_raw)",
        f"    return",
    ]
    if names:
        body += [f"if {' or '.join(f'{n} is {p}M' for n in names)}:", f"    raise {p}kernel._prepared_partial({given})"]
    for name, code in zip(names, codes):
        body += _fits(p, name, code, names.index(name))
    raw = ", ".join(f"{p}v{i}" for i in range(len(names)))
    body += [f"{p}stream = {p}streams[{p}current_stream({p}device)]", f"if {p}get_ident() == {p}owner:"]
    if names:
        body += [f"    try:", f"        {p}pack({p}buffer, 0, {raw})",
                 f"    except {p}PACK_ERRORS as {p}error:",
                 f"        raise {p}variant.pack_error([{raw}], {p}error) from None"]
    body += [f"    {p}err = {p}launch({p}fn, {p}gx, {p}gy, {p}gz, {p}threads, 1, 1, {p}smem, {p}stream, {p}params, "
             f"{p}flags)[0]",
             f"else:",
             f"    {p}err = {p}variant.launch_shared({p}launch, {p}fn, {p}gx, {p}gy, {p}gz, {p}stream, [{raw}])",
             f"if {p}err:",
             f"    {p}variant.launch_failed({p}drv, {p}err, {p}device, ({p}gx, {p}gy, {p}gz), [{raw}])"]
    name = function_name(kernel)
    lines = [f"def {p}make_prepared({p}pdrv, {p}device, {p}entry, {p}gx, {p}gy, {p}gz, {p}own_params, {p}own_raw):",
             f"    {p}_, {p}fn, {p}pack, {p}buffer, {p}params, {p}threads, {p}smem, {p}owner, {p}variant, {p}flags = "
             f"{p}entry",
             f"    def {name}({signature}):"]
    lines += ["        " + line for line in body]
    lines.append(f"    {name}.__qualname__ = {kernel.__name__ + '.prepared'!r}")
    lines.append(f"    return {name}")
    return "\n".join(lines) + "\n"


def build_prepared(kernel: Any, tensor_type: type, codes: Sequence[str], dtypes: Sequence[Any], driver: Any,
                   device: int, entry: tuple, grid: tuple[int, int, int], own_params: Any,
                   own_raw: list) -> Callable[..., None]:
    """exec generate_prepared and make the prepared launch function."""
    source = generate_prepared(kernel, codes)
    p = _prefix_for(list(kernel.arg_names) + [function_name(kernel)])
    namespace = {
        f"{p}kernel": kernel, f"{p}M": MISSING, f"{p}Tensor": tensor_type, f"{p}DTYPES": tuple(dtypes),
        f"{p}HOT": _driver.HOT, f"{p}get_ident": threading.get_ident, f"{p}PACK_ERRORS": PACK_ERRORS,
    }
    filename = f"<minitriton prepared launch of {kernel.__name__} {' '.join(codes)}>"
    exec(compile_cached(source, filename), namespace)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return namespace[f"{p}make_prepared"](driver, device, entry, *grid, own_params, own_raw)
