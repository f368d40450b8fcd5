"""The `minitriton` command line: ahead-of-time compilation and running passes on IR text.

    minitriton compile FILE.py[:KERNEL] [--signature "x:*bf16,n:i32"] [-D NAME=VALUE ...] [--num-warps N]
                       [--num-stages N] [--emit ir|ptx|cubin|all] [-o DIR]
    minitriton opt FILE.mtir --pass NAME[,NAME...] [--no-locs]

`compile` imports FILE.py and compiles, for each kernel specialization, into DIR:
    NAME.mtir         IR after the frontend (what `minitriton opt` takes)     --emit ir / all
    NAME.passes.mtir  IR after the compiler's pass pipeline                   --emit ir / all
    NAME.ptx          PTX                                                     --emit ptx / all
    NAME.cubin        ptxas output for sm_90a                                 --emit cubin / all
    NAME.json         metadata: entry name, parameters, num_warps, shared memory, registers, spills (always)
With FILE.py:KERNEL and --signature it compiles that one specialization; otherwise every specialization the file
declares with `kernel.specialize(...)`. User errors (compilation, parse, verify, unknown pass, missing file) print
one message to stderr and exit with status 1.
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

EMITS = ("ir", "ptx", "cubin", "all")


class CLIError(Exception):
    """A mistake in how the command was called (bad file, unknown kernel, missing specializations)."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except user_errors() as e:
        sys.stderr.write(f"minitriton: error: {message_of(e)}\n")
        return 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minitriton", description="MiniTriton: GPU kernels in Python for sm_90a")
    commands = parser.add_subparsers(dest="command", required=True)

    comp = commands.add_parser("compile", help="compile kernels ahead of time (IR, PTX, cubin, metadata)")
    comp.add_argument("target", metavar="FILE.py[:KERNEL]", help="a Python file declaring @mt.kernel functions")
    comp.add_argument("--signature", help='runtime argument types, e.g. "x:*bf16,y:*bf16,n:i32" (needs :KERNEL)')
    comp.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE",
                      help="a constexpr value (with --signature); repeat for several")
    comp.add_argument("--num-warps", type=int, help="warps per program (with --signature; default: the kernel's)")
    comp.add_argument("--num-stages", type=int, help="software pipeline stages (with --signature)")
    comp.add_argument("--emit", choices=EMITS, default="all", help="what to write (default: all)")
    comp.add_argument("-o", dest="out", default=".", metavar="DIR", help="output folder (default: .)")
    comp.set_defaults(handler=cmd_compile)

    opt = commands.add_parser("opt", help="run passes on an IR file and print the result")
    opt.add_argument("file", metavar="FILE.mtir")
    opt.add_argument("--pass", dest="passes", action="append", required=True, metavar="NAME[,NAME...]",
                     help="passes to run, in order (comma-separated or repeated)")
    opt.add_argument("--no-locs", action="store_true", help="print without source locations")
    opt.set_defaults(handler=cmd_opt)
    return parser


def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that are the user's mistake: reported in one line, without a traceback."""
    from minitriton.errors import CompilationError
    from minitriton.ir import VerifyError
    from minitriton.runtime.specialize import SignatureError

    errors: list[type[BaseException]] = [CLIError, CompilationError, VerifyError, SignatureError, OSError, KeyError]
    try:
        from minitriton.ir.parser import ParseError

        errors.append(ParseError)
    except ImportError:
        pass
    return tuple(errors)


def message_of(e: BaseException) -> str:
    if isinstance(e, KeyError) and e.args:
        return str(e.args[0])  # str(KeyError) would quote the message
    if isinstance(e, FileNotFoundError):
        return f"no such file: {e.filename}"
    return str(e)


# ------------------------------------------------------------------------------------------------- opt


def cmd_opt(args: argparse.Namespace) -> int:
    from minitriton.ir import print_module, verify
    from minitriton.passes import get_pass

    text = Path(args.file).read_text()
    names = [n.strip() for group in args.passes for n in group.split(",") if n.strip()]
    passes = [get_pass(n) for n in names]  # unknown names fail before any work
    from minitriton.ir.parser import parse_module
    module = parse_module(text, filename=args.file)
    verify(module)
    for name, run in zip(names, passes):
        module = run(module)
        try:
            verify(module)
        except Exception as e:
            raise type(e)(f"after pass '{name}': {e}") from None
    sys.stdout.write(print_module(module, with_locs=not args.no_locs))
    return 0


# --------------------------------------------------------------------------------------------- compile


def cmd_compile(args: argparse.Namespace) -> int:
    from minitriton import compiler

    path, kernel_name = split_target(args.target)
    module = import_file(path)
    specs = select_specializations(module, path, kernel_name, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = "ir" if args.emit == "ir" else "cubin"
    has_ptxas = compiler.ptxas_path() is not None
    if target == "cubin" and not has_ptxas:
        sys.stderr.write("minitriton: ptxas was not found on PATH: writing PTX only (no cubin, no register "
                         "report)\n")
    for name, spec in output_names(specs):
        compiled = spec.compile(target=target, keep_ir=args.emit in ("ir", "all"))
        written = write_outputs(out, name, spec, compiled, args.emit)
        print(f"{name}: {resources(compiled.metadata)} -> {out / name}.{{{','.join(written)}}}")
    return 0


def resources(meta: dict[str, Any]) -> str:
    """registers, shared memory and spills as ptxas reported them (one line)."""
    head = f"entry {meta['name']}, num_warps={meta['num_warps']}"
    if meta.get("registers") is None:
        return head + " (ptxas not run: no register report)"
    return (f"{head}, {meta['registers']} registers, {meta['shared']} B shared memory, "
            f"{meta['spill_stores']} B spill stores, {meta['spill_loads']} B spill loads")


def split_target(target: str) -> tuple[Path, str | None]:
    head, sep, tail = target.rpartition(":")
    if sep and tail.isidentifier() and head:
        path, kernel_name = Path(head), tail
    else:
        path, kernel_name = Path(target), None
    if not path.is_file():
        raise CLIError(f"no such file: {path}")
    return path, kernel_name


def package_of(resolved: Path) -> tuple[Path, str] | None:
    """(the folder holding the top package, the dotted module name) when the file lies in a package (its folder
    has an __init__.py), so that its relative imports work; None for a lone script."""
    parts = [resolved.stem]
    folder = resolved.parent
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    return (folder, ".".join(parts)) if len(parts) > 1 else None


def import_file(path: Path) -> Any:
    """Import a Python file: as a module of its package when it is in one (relative imports work), else as a
    fresh module with its folder first on sys.path (for its sibling imports)."""
    resolved = path.resolve()
    package = package_of(resolved)
    if package is not None:
        return _import_in_package(path, *package)
    name = f"_minitriton_cli_{resolved.stem}_{abs(hash(str(resolved))):x}"
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise CLIError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(resolved.parent))
    try:
        spec.loader.exec_module(module)
    except user_errors():
        raise
    except Exception as e:  # the user's module failed to import: say so in one line
        raise CLIError(f"importing {path} failed: {type(e).__name__}: {e}") from None
    finally:
        sys.path.remove(str(resolved.parent))
    return module


def _import_in_package(path: Path, root: Path, dotted: str) -> Any:
    sys.path.insert(0, str(root))
    try:
        return importlib.import_module(dotted)
    except user_errors():
        raise
    except Exception as e:  # the user's module failed to import: say so in one line
        raise CLIError(f"importing {path} (as {dotted}) failed: {type(e).__name__}: {e}") from None
    finally:
        sys.path.remove(str(root))


def kernels_in(module: Any) -> dict[str, Any]:
    """The module's kernels by name; an @mt.autotune-wrapped kernel counts as its underlying kernel."""
    from minitriton.runtime.autotune import Autotuner
    from minitriton.runtime.jit import Kernel

    found: dict[str, Any] = {}
    for name, v in vars(module).items():
        v = v.kernel if isinstance(v, Autotuner) else v
        if isinstance(v, Kernel) and all(v is not k for k in found.values()):  # one kernel under two names
            found[name] = v
    return found


def select_specializations(module: Any, path: Path, kernel_name: str | None, args: argparse.Namespace) -> list:
    kernels = kernels_in(module)
    explicit = args.signature is not None
    if not explicit and (args.defines or args.num_warps is not None or args.num_stages is not None):
        raise CLIError("-D, --num-warps and --num-stages apply to an explicit --signature "
                       "(declared specializations carry their own)")
    if kernel_name is None:
        if explicit:
            raise CLIError("--signature needs a kernel: FILE.py:KERNEL")
        here = str(path.resolve())
        specs = [s for k in kernels.values() if os.path.realpath(k.file) == here for s in k.specializations]
        if not specs:
            raise CLIError(f"{path} declares no specializations: add `KERNEL.specialize(signature=..., ...)` "
                           f"or pass FILE.py:KERNEL --signature ...")
        return specs
    if kernel_name not in kernels:
        raise CLIError(f"no @mt.kernel named '{kernel_name}' in {path}; kernels: {', '.join(kernels) or 'none'}")
    kernel = kernels[kernel_name]
    if explicit:
        constexprs = dict(parse_define(d) for d in args.defines)
        return [kernel.aot_spec(args.signature, args.num_warps, args.num_stages, **constexprs)]
    if not kernel.specializations:
        raise CLIError(f"kernel '{kernel_name}' declares no specializations; pass --signature")
    return list(kernel.specializations)


def parse_define(text: str) -> tuple[str, Any]:
    """NAME=VALUE: a Python literal (1024, 0.5, True), a dtype name (bf16, float32), else the string."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip().isidentifier():
        raise CLIError(f"-D expects NAME=VALUE, got {text!r}")
    return name.strip(), parse_value(value.strip())


def parse_value(value: str) -> Any:
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        pass
    from minitriton.ir.types import SCALAR_TYPES, TRITON_SPELLINGS, ScalarType
    import minitriton.language as language

    bare = value.removeprefix("mt.")
    if bare in TRITON_SPELLINGS:
        return TRITON_SPELLINGS[bare]
    if bare in SCALAR_TYPES:
        return SCALAR_TYPES[bare]
    if isinstance(getattr(language, bare, None), ScalarType):
        return getattr(language, bare)
    return value


def output_names(specs: list) -> list[tuple[str, Any]]:
    """A file name per specialization: its given name, else the kernel's (suffixed when it has several)."""
    per_kernel: dict[str, int] = {}
    for s in specs:
        per_kernel[s.kernel.__name__] = per_kernel.get(s.kernel.__name__, 0) + 1
    names: list[tuple[str, Any]] = []
    used: set[str] = set()
    for s in specs:
        base = s.name or (s.kernel.__name__ if per_kernel[s.kernel.__name__] == 1
                          else f"{s.kernel.__name__}_{s.describe()}")
        name, i = base, 1
        while name in used:
            i += 1
            name = f"{base}_{i}"
        used.add(name)
        names.append((name, s))
    return names


def write_outputs(out: Path, name: str, spec: Any, compiled: Any, emit: str) -> list[str]:
    """Write the files `emit` asks for; returns their suffixes."""
    written: list[str] = []

    def write(suffix: str, data: str | bytes) -> None:
        path = out / f"{name}{suffix}"
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data)
        written.append(suffix.lstrip("."))

    if emit in ("ir", "all"):
        stages = list(compiled.ir.items())
        write(".mtir", stages[0][1])
        write(".passes.mtir", stages[-1][1])
    if emit in ("ptx", "all") or (emit == "cubin" and compiled.cubin is None):
        write(".ptx", compiled.ptx)
    if emit in ("cubin", "all") and compiled.cubin is not None:
        write(".cubin", compiled.cubin)
    meta = dict(compiled.metadata)
    meta["signature"] = ", ".join(f"{n}:{s.code}" for n, s in spec.args.items())
    write(".json", json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return written


if __name__ == "__main__":
    sys.exit(main())
