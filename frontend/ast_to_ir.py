"""Python AST -> tile IR: walks a kernel's syntax tree (no tracing) and emits IR through the semantic layer.

Values in the walk are Python constants (ints, floats, bools, tuples, dtypes, None: folded at compile time) or
`TileValue`s (IR scalars and tiles). Control flow on constants is folded: `if BLOCK > 64:` picks a branch,
`for i in mt.static_range(4)` unrolls. Control flow on IR values becomes `scf.if` / `scf.for` / `scf.while`; the
variables a body reassigns become the op's results (loop-carried values), found by looking at which names the body
assigns. A Python number carried through a loop gets its IR type from a trial pass over the body.

Every user mistake raises CompilationError at the innermost node being compiled.
"""
from __future__ import annotations

import ast
import builtins
import math
import operator
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

from minitriton import language as mtl
from minitriton.errors import CompilationError
from minitriton.ir import Block, Builder, Location, Module, Operation, Region, function_body, make_function
from minitriton.ir.types import PointerType, ScalarType, TensorDescType, Type, i1, i32, i64

from .early_return import fold_early_returns
from .partitions import RingValue, check_specialized_kernel, compile_warp_specialize, ring_attribute
from .semantic import Number, Semantic, TileValue, describe, promote_scalars, python_constant_type, weak_type
from .source import FunctionSource, InlineFunction, function_source

BINOPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.FloorDiv: "floordiv",
          ast.Mod: "rem", ast.BitAnd: "and", ast.BitOr: "or", ast.BitXor: "xor", ast.LShift: "shl",
          ast.RShift: "shr", ast.Pow: "pow"}
PY_BINOPS: dict[str, Callable[[Any, Any], Any]] = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
    "floordiv": operator.floordiv, "rem": operator.mod, "and": operator.and_, "or": operator.or_,
    "xor": operator.xor, "shl": operator.lshift, "shr": operator.rshift, "pow": operator.pow}
CMPOPS = {ast.Eq: "eq", ast.NotEq: "ne", ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge"}
PY_CMPOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
    ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}

# Python builtins usable on compile-time values inside kernels.
PY_BUILTINS: dict[str, Any] = {name: getattr(builtins, name) for name in (
    "len", "min", "max", "abs", "int", "float", "bool", "isinstance", "tuple", "list", "zip", "enumerate",
    "reversed", "print", "round", "divmod", "all", "any", "sorted", "str", "type")}
PY_BUILTINS.update({"range": range, "True": True, "False": False, "None": None})

UNSUPPORTED_STMTS = {ast.Break: "'break'", ast.Continue: "'continue'", ast.Try: "'try' blocks", ast.Raise: "'raise'", ast.Delete: "'del'", ast.Global: "'global'",
                     ast.Nonlocal: "'nonlocal'", ast.ClassDef: "class definitions", ast.Import: "imports",
                     ast.ImportFrom: "imports", ast.FunctionDef: "nested function definitions",
                     ast.AsyncFunctionDef: "async functions", ast.AsyncFor: "async loops",
                     ast.AsyncWith: "async blocks", ast.Match: "'match' statements"}


class _Return(Exception):
    """Unwinds to the enclosing function call when the body says `return`."""

    def __init__(self, value: Any):
        self.value = value


class BoundMethod:
    """`x.to`, `x.reshape`, ...: a tile method waiting for its arguments."""

    def __init__(self, fn: Callable[..., Any], name: str):
        self.fn, self.name = fn, name


class Frame:
    """One function being compiled: its source, its variables, and how deep in runtime regions it started."""

    def __init__(self, source: FunctionSource, scope: dict[str, Any], region_depth: int):
        self.source = source
        self.scope = scope
        self.region_depth = region_depth


class KernelCompiler:
    """Compiles one kernel specialization to an `mt.func`."""

    MAX_INLINE_DEPTH = 32

    def __init__(self, source: FunctionSource):
        self.builder = Builder()
        self.sem = Semantic(self.builder)
        self.frames: list[Frame] = []
        self.region_depth = 0
        self.root = source
        self.loop_locals: set[str] = set()  # names defined only inside a region, for a clearer error later
        self.assigned_at: dict[str, Location] = {}  # where each name was last assigned, for error messages

    # ------------------------------------------------------------------------------------- entry

    def compile(self, arg_types: dict[str, Type], constexprs: dict[str, Any], divisibility: dict[str, int],
                equal_to_one: set[str], num_warps: int) -> Operation:
        src = self.root
        fdef = src.tree
        self.num_warps = num_warps
        params = self.parameters(fdef)
        scope: dict[str, Any] = {}
        runtime: list[tuple[str, Type]] = []
        for name, (node, is_constexpr, default) in params.items():
            if name in constexprs:
                scope[name] = constexprs[name]
            elif name in arg_types:
                runtime.append((name, arg_types[name]))
            elif is_constexpr and default is not _NO_DEFAULT:
                scope[name] = default
            elif is_constexpr:
                raise CompilationError(f"missing constexpr '{name}' (pass it as a keyword: {name}=...)",
                                       src.loc(node))
            else:
                raise CompilationError(f"missing argument '{name}'", src.loc(node))
        extra = (set(arg_types) | set(constexprs)) - set(params)
        if extra:
            raise CompilationError(f"unknown parameter(s) {', '.join(sorted(extra))} for kernel '{fdef.name}'",
                                   src.loc(fdef))
        func = make_function(fdef.name, [t for _, t in runtime], [n for n, _ in runtime], loc=src.loc(fdef),
                             num_warps=num_warps,
                             divisibility=[int(divisibility.get(n, 1)) for n, _ in runtime])
        entry = function_body(func)
        for (name, _), arg in zip(runtime, entry.args):
            scope[name] = 1 if name in equal_to_one else TileValue(arg)
        self.builder.block = entry
        self.frames.append(Frame(src, scope, 0))
        try:
            self.visit_body(fold_early_returns(fdef.body))
        except _Return:
            pass
        self.builder.loc = src.loc(fdef)
        self.builder.create("mt.return")
        check_specialized_kernel(entry)
        return func

    def parameters(self, fdef: ast.FunctionDef) -> dict[str, tuple[ast.arg, bool, Any]]:
        """name -> (node, annotated mt.constexpr, default value or _NO_DEFAULT)."""
        a = fdef.args
        if a.vararg or a.kwarg or a.posonlyargs:
            raise CompilationError("kernels take plain named parameters (no *args, **kwargs or '/')",
                                   self.root.loc(fdef))
        args = a.args + a.kwonlyargs
        defaults: list[Any] = [_NO_DEFAULT] * (len(a.args) - len(a.defaults)) + list(a.defaults)
        defaults += list(a.kw_defaults)
        out = {}
        for arg, d in zip(args, defaults):
            value = _NO_DEFAULT if d is None or d is _NO_DEFAULT else self.static_eval(d)
            out[arg.arg] = (arg, self.is_constexpr_annotation(arg.annotation), value)
        return out

    def is_constexpr_annotation(self, ann: ast.expr | None) -> bool:
        if ann is None:
            return False
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
            return ann.value.split(".")[-1] == "constexpr"
        try:
            return self.static_eval(ann) is mtl.constexpr
        except CompilationError:
            return False

    def static_eval(self, node: ast.expr) -> Any:
        """Evaluate a default value or annotation in the function's globals (compile-time only)."""
        with self.frame_for_static():
            v = self.expr(node)
        if isinstance(v, TileValue):
            raise CompilationError("default values must be compile-time constants", self.root.loc(node))
        return v

    @contextmanager
    def frame_for_static(self) -> Iterator[None]:
        self.frames.append(Frame(self.root, {}, 0))
        try:
            yield
        finally:
            self.frames.pop()

    # ------------------------------------------------------------------------------------- helpers

    @property
    def frame(self) -> Frame:
        return self.frames[-1]

    @property
    def scope(self) -> dict[str, Any]:
        return self.frame.scope

    def loc(self, node: ast.AST) -> Location:
        return self.frame.source.loc(node)

    @contextmanager
    def at(self, node: ast.AST) -> Iterator[None]:
        """Emit at `node`'s location; turn errors without a location into errors at this node."""
        saved = self.builder.loc
        self.builder.loc = self.loc(node)
        try:
            yield
        except (CompilationError, _Return):
            raise
        except RecursionError:
            raise CompilationError("the kernel is nested too deeply (recursion?)", self.loc(node)) from None
        except Exception as e:  # a Python error on compile-time values, e.g. 1 // 0
            raise CompilationError(f"{type(e).__name__}: {e}", self.loc(node)) from e
        finally:
            self.builder.loc = saved

    def located(self, err: CompilationError, node: ast.AST) -> CompilationError:
        return err if err.loc is not None else CompilationError(err.message, self.loc(node))

    # ------------------------------------------------------------------------------------- statements

    def visit_body(self, stmts: Sequence[ast.stmt]) -> None:
        for s in stmts:
            self.stmt(s)

    def stmt(self, node: ast.stmt) -> None:
        try:
            with self.at(node):
                handler = getattr(self, f"stmt_{type(node).__name__}", None)
                if handler is None:
                    what = UNSUPPORTED_STMTS.get(type(node), f"'{type(node).__name__}' statements")
                    raise CompilationError(f"{what} are not supported in kernels"
                                           if what.endswith("s") else f"{what} is not supported in kernels")
                handler(node)
        except CompilationError as e:
            raise self.located(e, node) from e.__cause__

    def stmt_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return  # a docstring
        self.expr(node.value)

    def stmt_Pass(self, node: ast.Pass) -> None:
        pass

    def stmt_Assign(self, node: ast.Assign) -> None:
        value = self.expr(node.value)
        for target in node.targets:
            self.assign(target, value)

    def stmt_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is None:
            raise CompilationError("a declaration without a value is not supported")
        self.assign(node.target, self.expr(node.value))

    def stmt_AugAssign(self, node: ast.AugAssign) -> None:
        if not isinstance(node.target, ast.Name):
            raise CompilationError("augmented assignment needs a plain variable on the left")
        current = self.lookup(node.target.id, node.target)
        self.assign(node.target, self.binop(BINOPS[type(node.op)], current, self.expr(node.value)))

    def assign(self, target: ast.expr, value: Any) -> None:
        if isinstance(target, ast.Name):
            if isinstance(value, (BoundMethod,)):
                raise CompilationError("a method cannot be stored in a variable; call it")
            self.scope[target.id] = value
            self.assigned_at[target.id] = self.loc(target)
        elif isinstance(target, (ast.Tuple, ast.List)):
            if not isinstance(value, tuple):
                raise CompilationError(f"cannot unpack {describe(value)} into {len(target.elts)} names")
            if len(value) != len(target.elts):
                raise CompilationError(f"cannot unpack {len(value)} values into {len(target.elts)} names")
            for t, v in zip(target.elts, value):
                self.assign(t, v)
        elif isinstance(target, ast.Subscript):
            raise CompilationError("assigning into a tile element is not supported; build the tile with mt.where")
        else:
            raise CompilationError(f"cannot assign to {type(target).__name__}")

    def stmt_With(self, node: ast.With) -> None:
        if len(node.items) != 1 or node.items[0].optional_vars is not None:
            raise CompilationError("'with' blocks in kernels take one mt.warp_specialize() or mt.partition(...), "
                                   "without 'as'")
        what = self.expr(node.items[0].context_expr)
        if isinstance(what, mtl.warp_specialize):
            compile_warp_specialize(self, node)
        elif isinstance(what, mtl.partition):
            raise CompilationError("`with mt.partition(...):` blocks go directly inside a `with "
                                   "mt.warp_specialize():` block")
        else:
            raise CompilationError(f"'with' blocks in kernels are for mt.warp_specialize() and mt.partition(...), "
                                   f"not {describe(what)}")

    def stmt_Assert(self, node: ast.Assert) -> None:
        cond = self.expr(node.test)
        if isinstance(cond, TileValue):
            raise CompilationError("assert needs a compile-time condition (runtime asserts are not supported)")
        if not cond:
            msg = self.expr(node.msg) if node.msg is not None else ""
            raise CompilationError(f"assertion failed: {msg}" if msg else "assertion failed")

    def stmt_Return(self, node: ast.Return) -> None:
        if self.region_depth != self.frame.region_depth:
            raise CompilationError("'return' inside a runtime for/while loop, a value returned from inside a runtime "
                                   "if, or a return before the end of an if branch, is not supported; compute the "
                                   "value with mt.where or restructure the loop (a bare 'return' ending an if branch "
                                   "is fine)")
        raise _Return(self.expr(node.value) if node.value is not None else None)

    def stmt_If(self, node: ast.If) -> None:
        cond = self.expr(node.test)
        if not isinstance(cond, TileValue):
            self.visit_body(node.body if cond else node.orelse)
            return
        if cond.is_tile:
            raise CompilationError(f"an 'if' condition must be a scalar, got a tile {cond.type}; "
                                   "use mt.where for elementwise choices")
        c = self.sem.to_bool(cond)
        before = dict(self.scope)
        then_block, then_scope = self.run_region(node.body, dict(before), [])
        else_block, else_scope = self.run_region(node.orelse, dict(before), [])
        names, then_vals, else_vals = self.merge(before, then_scope, else_scope)
        then_vals, else_vals = self.unify_pairs(names, then_vals, else_vals, then_block, else_block)
        self.yield_into(then_block, then_vals)
        self.yield_into(else_block, else_vals)
        op = self.builder.create("scf.if", [c.handle], [v.type for v in then_vals],
                                 regions=[Region([then_block]), Region([else_block])])
        self.scope.clear()
        self.scope.update(before)
        for k in set(then_scope) | set(else_scope):
            if k in names:
                continue
            if k in then_scope and k in else_scope:
                x, y = then_scope[k], else_scope[k]
                if x is y or (not isinstance(x, TileValue) and self.same_constant(x, y)):
                    self.scope[k] = x
            elif k not in before:
                self.loop_locals.add(k)
        for name, result in zip(names, op.results):
            self.scope[name] = TileValue(result)

    def run_region(self, body: Sequence[ast.stmt], scope: dict[str, Any], args: list[Any],
                   block: Block | None = None) -> tuple[Block, dict[str, Any]]:
        """Compile `body` into a fresh block with `scope` as the variables; returns the block and final scope."""
        block = block if block is not None else Block()
        saved_block, saved_scope = self.builder.block, self.frame.scope
        self.builder.block = block
        self.frame.scope = scope
        self.region_depth += 1
        try:
            self.visit_body(body)
        finally:
            self.region_depth -= 1
            self.builder.block = saved_block
            self.frame.scope = saved_scope
        return block, scope

    def merge(self, before: dict[str, Any], a: dict[str, Any], b: dict[str, Any]
              ) -> tuple[list[str], list[Any], list[Any]]:
        """Names whose value differs between the two branches (or from before) and exists after both."""
        names, va, vb = [], [], []
        for name in sorted(set(a) | set(b)):
            if name not in a or name not in b:
                continue  # defined in one branch only: not visible after the if
            x, y = a[name], b[name]
            if x is y and (name not in before or before[name] is x):
                continue
            if not isinstance(x, TileValue) and not isinstance(y, TileValue) and self.same_constant(x, y):
                continue
            names.append(name)
            va.append(x)
            vb.append(y)
        return names, va, vb

    @staticmethod
    def same_constant(x: Any, y: Any) -> bool:
        return type(x) is type(y) and x == y

    def carried_value_check(self, name: str, v: Any) -> None:
        if not isinstance(v, (TileValue,) + Number):
            raise CompilationError(f"variable '{name}' ({describe(v)}) changes inside a runtime if/loop; only "
                                   "numbers, scalars and tiles can")

    def unify_pairs(self, names: list[str], xs: list[Any], ys: list[Any], bx: Block, by: Block
                    ) -> tuple[list[TileValue], list[TileValue]]:
        """Give each pair (then value, else value) one IR type, materializing constants in their block."""
        outx, outy = [], []
        for name, x, y in zip(names, xs, ys):
            self.carried_value_check(name, x)
            self.carried_value_check(name, y)
            ty = self.common_type(name, x, y)
            outx.append(self.materialize(x, ty, bx))
            outy.append(self.materialize(y, ty, by))
        return outx, outy

    def common_type(self, name: str, x: Any, y: Any) -> Type:
        if isinstance(x, TileValue) and isinstance(y, TileValue):
            if x.type != y.type:
                raise CompilationError(f"variable '{name}' is {x.type} on one path and {y.type} on the other; "
                                       "cast one so they match")
            return x.type
        if isinstance(x, TileValue) or isinstance(y, TileValue):
            t, c = (x, y) if isinstance(x, TileValue) else (y, x)
            if isinstance(t.dtype, PointerType):
                raise CompilationError(f"variable '{name}' is a pointer on one path and {c!r} on the other")
            return t.type  # the constant takes the value's type (a tile's constant is splat)
        return promote_scalars(python_constant_type(x), python_constant_type(y))

    def materialize(self, v: Any, ty: Type, block: Block) -> TileValue:
        if isinstance(v, TileValue):
            return v
        saved = self.builder.block
        self.builder.block = block
        try:
            return self.sem.constant(v, ty)
        finally:
            self.builder.block = saved

    def yield_into(self, block: Block, values: Sequence[TileValue]) -> None:
        saved = self.builder.block
        self.builder.block = block
        try:
            self.builder.create("scf.yield", [v.handle for v in values])
        finally:
            self.builder.block = saved

    # ------------------------------------------------------------------------------------- loops

    def stmt_For(self, node: ast.For) -> None:
        if node.orelse:
            raise CompilationError("'for ... else' is not supported")
        iterable = self.expr(node.iter)
        if isinstance(iterable, mtl.static_range):
            return self.static_for(node, range(*[self.sem.static_int(a, "static_range bound")
                                                 for a in iterable.args]))
        if isinstance(iterable, (tuple, list)) or isinstance(iterable, (zip, enumerate)):
            return self.static_for(node, list(iterable))
        if not isinstance(iterable, RangeCall):
            raise CompilationError(f"kernels loop over range(...) or mt.static_range(...), not {describe(iterable)}")
        if not isinstance(node.target, ast.Name):
            raise CompilationError("the loop variable must be a plain name")
        self.runtime_for(node, iterable)

    def static_for(self, node: ast.For, values: Sequence[Any]) -> None:
        for v in values:
            self.assign(node.target, v)
            self.visit_body(node.body)

    def runtime_for(self, node: ast.For, rng: "RangeCall") -> None:
        step = rng.step
        if isinstance(step, int) and step <= 0:
            raise CompilationError(f"range step must be positive in kernels, got {step}")
        bounds = [rng.start, rng.stop, step]
        wide = any(isinstance(b, TileValue) and b.dtype == i64 for b in bounds) or \
            any(isinstance(b, int) and not -2**31 <= b < 2**31 for b in bounds)
        ity = i64 if wide else i32
        handles = []
        for b in bounds:
            if isinstance(b, TileValue) and (b.is_tile or isinstance(b.dtype, PointerType) or b.dtype.is_float):
                raise CompilationError(f"range bounds must be integer scalars, got {b.type}")
            if not isinstance(b, (TileValue, int)) or isinstance(b, bool):
                raise CompilationError(f"range bounds must be integers, got {describe(b)}")
            handles.append(self.sem.cast(b, ity).handle)
        var = node.target.id  # type: ignore[union-attr]

        def bind(scope: dict[str, Any], block: Block) -> None:
            scope[var] = TileValue(block.args[0])

        self.loop(node, node.body, carried_prefix=[ity], bind=bind, make_op=lambda inits, types, region: (
            self.builder.create("scf.for", handles + inits, types, regions=[region])))

    def stmt_While(self, node: ast.While) -> None:
        if node.orelse:
            raise CompilationError("'while ... else' is not supported")
        names = self.carried_names(node.body + [ast.Expr(node.test)])
        inits, init_types = self.loop_inits(node, node.body, names, [], lambda s, b: None)
        before_block = Block([v.type for v in inits])
        scope = dict(self.scope)
        for name, arg in zip(names, before_block.args):
            scope[name] = TileValue(arg)
        saved_block, saved_scope = self.builder.block, self.frame.scope
        self.builder.block, self.frame.scope = before_block, scope
        self.region_depth += 1
        try:
            with self.at(node.test):
                cond = self.expr(node.test)
                if not isinstance(cond, TileValue):
                    raise CompilationError("a while condition must depend on runtime values (a constant "
                                           "condition would loop forever or never; 'break' is not supported)")
                if cond.is_tile:
                    raise CompilationError(f"a while condition must be a scalar, got {cond.type}")
                c = self.sem.to_bool(cond)
                self.builder.create("scf.condition", [c.handle] + list(before_block.args))
        finally:
            self.region_depth -= 1
            self.builder.block, self.frame.scope = saved_block, saved_scope
        after_block = Block([v.type for v in inits])
        body_scope = dict(self.scope)
        for name, arg in zip(names, after_block.args):
            body_scope[name] = TileValue(arg)
        _, final = self.run_region(node.body, body_scope, [], after_block)
        self.yield_carried(node, names, final, after_block, init_types)
        op = self.builder.create("scf.while", [v.handle for v in inits], init_types,
                                 regions=[Region([before_block]), Region([after_block])])
        self.bind_results(names, op, final)

    def carried_names(self, body: Sequence[ast.stmt]) -> list[str]:
        """Names the body assigns that exist before the loop: they become loop-carried values."""
        assigned: list[str] = []
        for stmt in body:
            for n in ast.walk(stmt):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id not in assigned:
                    assigned.append(n.id)
        return [n for n in assigned if n in self.scope]

    def loop_inits(self, node: ast.stmt, body: Sequence[ast.stmt], names: list[str], prefix: list[Type],
                   bind: Callable[[dict[str, Any], Block], None]) -> tuple[list[TileValue], list[Type]]:
        """The initial IR values of the carried names, with types stable across one iteration."""
        values = [self.scope[n] for n in names]
        for n, v in zip(names, values):
            self.carried_value_check(n, v)
        types = [v.type if isinstance(v, TileValue) else python_constant_type(v) for v in values]
        for _ in range(4):  # a trial pass over the body finds what type each carried number settles on
            if all(isinstance(v, TileValue) for v in values):
                break
            block = Block(prefix + types)
            scope = dict(self.scope)
            bind(scope, block)
            for n, arg in zip(names, block.args[len(prefix):]):
                scope[n] = TileValue(arg)
            _, final = self.run_region(body, scope, [], block)
            new_types = []
            for n, t, v0 in zip(names, types, values):
                out = final.get(n)
                if isinstance(out, TileValue) and out.type != t and not isinstance(v0, TileValue):
                    new_types.append(self.promote_carried(n, t, out.type))
                else:
                    new_types.append(t)
            if new_types == types:
                break
            types = new_types
        inits = [v if isinstance(v, TileValue) else self.sem.constant(v, t) for v, t in zip(values, types)]
        return inits, [v.type for v in inits]

    def promote_carried(self, name: str, t: Type, out: Type) -> Type:
        if out.is_tensor:
            return out  # e.g. acc = 0.0 before the loop, a tile after one iteration: the constant splats
        if isinstance(out, ScalarType) and isinstance(t, ScalarType):
            return promote_scalars(t, out)
        return out

    def loop(self, node: ast.For, body: Sequence[ast.stmt], carried_prefix: list[Type],
             bind: Callable[[dict[str, Any], Block], None],
             make_op: Callable[[list[Any], list[Type], Region], Operation]) -> None:
        names = self.carried_names(body)
        inits, init_types = self.loop_inits(node, body, names, carried_prefix, bind)
        block = Block(carried_prefix + init_types)
        scope = dict(self.scope)
        bind(scope, block)
        for name, arg in zip(names, block.args[len(carried_prefix):]):
            scope[name] = TileValue(arg)
        _, final = self.run_region(body, scope, [], block)
        self.yield_carried(node, names, final, block, init_types)
        op = make_op([v.handle for v in inits], init_types, Region([block]))
        self.bind_results(names, op, final)

    def yield_carried(self, node: ast.stmt, names: list[str], final: dict[str, Any], block: Block,
                      types: list[Type]) -> None:
        outs = []
        for name, ty in zip(names, types):
            v = final[name]
            self.carried_value_check(name, v)
            if isinstance(v, TileValue) and v.type != ty:
                raise CompilationError(f"loop-carried variable '{name}' changes type from {ty} to {v.type} in the "
                                       "loop body; cast it so the type stays the same", self.assigned_at.get(name))
            outs.append(self.materialize(v, ty, block))
        self.yield_into(block, outs)

    def bind_results(self, names: list[str], op: Operation, final: dict[str, Any]) -> None:
        for name, result in zip(names, op.results):
            self.scope[name] = TileValue(result)
        for name in final:
            if name not in self.scope:
                self.loop_locals.add(name)

    # ------------------------------------------------------------------------------------- expressions

    def expr(self, node: ast.expr) -> Any:
        try:
            with self.at(node):
                handler = getattr(self, f"expr_{type(node).__name__}", None)
                if handler is None:
                    raise CompilationError(f"'{type(node).__name__}' expressions are not supported in kernels")
                return handler(node)
        except CompilationError as e:
            raise self.located(e, node) from e.__cause__

    def expr_Constant(self, node: ast.Constant) -> Any:
        if not isinstance(node.value, (int, float, bool, str, type(None))):
            raise CompilationError(f"constants of type {type(node.value).__name__} are not supported")
        return node.value

    def expr_Name(self, node: ast.Name) -> Any:
        return self.lookup(node.id, node)

    def lookup(self, name: str, node: ast.AST) -> Any:
        if name in self.scope:
            return self.scope[name]
        src = self.frame.source
        for table in (src.closure, src.globals):
            if name in table:
                return self.check_global(name, table[name])
        if name in PY_BUILTINS:
            return PY_BUILTINS[name]
        if name in self.loop_locals:
            raise CompilationError(f"'{name}' is only defined inside a loop or branch; give it a value before "
                                   "the loop/if to use it afterwards")
        raise CompilationError(f"name '{name}' is not defined")

    def check_global(self, name: str, value: Any) -> Any:
        if isinstance(value, (bool, int, float, str, type(None), tuple, ScalarType, type(mtl))) \
                or callable(value) or isinstance(value, InlineFunction):
            return value
        raise CompilationError(f"global '{name}' is a {type(value).__name__}; kernels can only use compile-time "
                               "constants, dtypes, modules and functions from globals (pass tensors as arguments)")

    def expr_Tuple(self, node: ast.Tuple) -> tuple[Any, ...]:
        return tuple(self.expr(e) for e in node.elts)

    expr_List = expr_Tuple

    def expr_JoinedStr(self, node: ast.JoinedStr) -> str:
        parts = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                parts.append(str(v.value))
            else:
                x = self.expr(v.value)  # type: ignore[attr-defined]
                parts.append(str(x.type) if isinstance(x, TileValue) else format(x))
        return "".join(parts)

    def expr_BinOp(self, node: ast.BinOp) -> Any:
        op = BINOPS.get(type(node.op))
        if op is None:
            raise CompilationError(f"operator {type(node.op).__name__} is not supported")
        return self.binop(op, self.expr(node.left), self.expr(node.right))

    def binop(self, op: str, a: Any, b: Any) -> Any:
        if not isinstance(a, TileValue) and not isinstance(b, TileValue):
            if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)) or \
                    isinstance(a, str) or isinstance(b, str):
                return PY_BINOPS[op](a, b)
            if not isinstance(a, Number) or not isinstance(b, Number):
                raise CompilationError(f"unsupported operands {describe(a)} and {describe(b)}")
            return PY_BINOPS[op](a, b)
        return self.sem.binary(op, a, b)

    def expr_UnaryOp(self, node: ast.UnaryOp) -> Any:
        v = self.expr(node.operand)
        if not isinstance(v, TileValue):
            return {ast.Not: operator.not_, ast.USub: operator.neg, ast.UAdd: operator.pos,
                    ast.Invert: operator.invert}[type(node.op)](v)
        if isinstance(node.op, ast.Not):
            if v.is_tile:
                raise CompilationError("'not' needs a scalar; use '~' or mt.where on tiles")
            return self.sem.logical_not(v)
        if isinstance(node.op, ast.USub):
            return self.sem.neg(v)
        if isinstance(node.op, ast.UAdd):
            return v
        return self.sem.invert(v)

    def expr_Compare(self, node: ast.Compare) -> Any:
        left = self.expr(node.left)
        result: Any = True
        for op, right_node in zip(node.ops, node.comparators):
            right = self.expr(right_node)
            if isinstance(left, TileValue) or isinstance(right, TileValue):
                if type(op) not in CMPOPS:
                    raise CompilationError(f"'{type(op).__name__}' cannot compare runtime values")
                r = self.sem.compare(CMPOPS[type(op)], left, right)
            else:
                r = PY_CMPOPS[type(op)](left, right)
            result = r if result is True else self.logical("and", result, r)
            left = right
        return result

    def expr_BoolOp(self, node: ast.BoolOp) -> Any:
        kind = "and" if isinstance(node.op, ast.And) else "or"
        value = self.expr(node.values[0])
        for n in node.values[1:]:
            if not isinstance(value, TileValue):
                if (kind == "and" and not value) or (kind == "or" and value):
                    return value  # Python short-circuit on compile-time values
                value = self.expr(n)
                continue
            value = self.logical(kind, value, self.expr(n))
        return value

    def logical(self, kind: str, a: Any, b: Any) -> Any:
        if not isinstance(a, TileValue) and not isinstance(b, TileValue):
            return (a and b) if kind == "and" else (a or b)
        if not isinstance(a, TileValue):
            a, b = b, a
        if not isinstance(b, TileValue):
            if kind == "and":
                return self.sem.to_bool(a) if b else False
            return True if b else self.sem.to_bool(a)
        x, y = self.sem.to_bool(a), self.sem.to_bool(b)
        x, y = self.sem.broadcast_all(x, y)
        return TileValue(self.builder.create1(f"mt.{kind}", [x.handle, y.handle], x.type))

    def expr_IfExp(self, node: ast.IfExp) -> Any:
        cond = self.expr(node.test)
        if not isinstance(cond, TileValue):
            return self.expr(node.body if cond else node.orelse)
        return self.sem.where(cond, self.expr(node.body), self.expr(node.orelse))

    def expr_Attribute(self, node: ast.Attribute) -> Any:
        base = self.expr(node.value)
        name = node.attr
        if isinstance(base, TileValue):
            return self.tile_attribute(base, name)
        if isinstance(base, RingValue):
            return ring_attribute(self.sem, base, name)
        if isinstance(base, ScalarType) and name in ("bits", "is_float", "is_signed", "name"):
            v = getattr(base, name)
            return v
        try:
            value = getattr(base, name)
        except AttributeError:
            raise CompilationError(f"{describe(base)} has no attribute '{name}'") from None
        return self.check_global(name, value)

    def tile_attribute(self, x: TileValue, name: str) -> Any:
        sem = self.sem
        if isinstance(x.type, TensorDescType):
            return self.descriptor_attribute(x, name)
        if name == "shape":
            return x.shape
        if name == "dtype":
            return x.dtype
        if name == "T":
            return sem.trans(x, ())
        if name == "numel":
            return x.handle.type.numel if x.is_tile else 1  # type: ignore[union-attr]
        methods: dict[str, Callable[..., Any]] = {
            "to": lambda dtype, bitcast=False: sem.cast(x, dtype, bitcast),
            "reshape": lambda *shape: sem.reshape(x, shape[0] if len(shape) == 1 else shape),
            "trans": lambda *dims: sem.trans(x, dims),
            "broadcast_to": lambda *shape: sem.broadcast_to(x, shape[0] if len(shape) == 1 else shape),
            "expand_dims": lambda axis: sem.expand_dims(x, axis),
            "sum": lambda axis=None, keep_dims=False: sem.reduce(x, axis, "sum", keep_dims),
            "max": lambda axis=None, keep_dims=False: sem.reduce(x, axis, "max", keep_dims),
            "min": lambda axis=None, keep_dims=False: sem.reduce(x, axis, "min", keep_dims),
            "cumsum": lambda axis=0: sem.scan(x, axis, "sum"),
        }
        if name in methods:
            return BoundMethod(methods[name], name)
        raise CompilationError(f"a {x.type} value has no attribute '{name}'")

    def descriptor_attribute(self, desc: TileValue, name: str) -> Any:
        """`desc.load(offsets)`, `desc.store(offsets, value)`, `desc.block_shape`, `desc.dtype` of a tensor
        descriptor argument."""
        ty = desc.type
        if name == "block_shape":
            return ty.block_shape  # type: ignore[union-attr]
        if name == "dtype":
            return ty.element  # type: ignore[union-attr]
        if name == "load":
            return BoundMethod(lambda offsets: self.sem.descriptor_load(desc, offsets), name)
        if name == "store":
            return BoundMethod(lambda offsets, value: self.sem.descriptor_store(desc, offsets, value), name)
        raise CompilationError(f"a tensor descriptor ({ty}) has no attribute '{name}' "
                               "(it has load, store, block_shape and dtype)")

    def expr_Subscript(self, node: ast.Subscript) -> Any:
        base = self.expr(node.value)
        index = self.expr(node.slice) if not isinstance(node.slice, ast.Slice) else self.slice_value(node.slice)
        if not isinstance(base, TileValue):
            if isinstance(index, TileValue):
                raise CompilationError("cannot index a compile-time sequence with a runtime value")
            return base[index]
        return self.index_tile(base, index if isinstance(index, tuple) else (index,))

    def expr_Slice(self, node: ast.Slice) -> slice:
        return self.slice_value(node)

    def slice_value(self, node: ast.Slice) -> slice:
        parts = [self.expr(p) if p is not None else None for p in (node.lower, node.upper, node.step)]
        return slice(*parts)

    def index_tile(self, x: TileValue, index: tuple[Any, ...]) -> TileValue:
        """`x[:, None]` style indexing: slices keep a dim (constant bounds `a:b` take a static sub-tile, see
        Semantic.extract_slice), None inserts one of size 1."""
        sliced = [item for item in index if item is not None]
        for item in sliced:
            if not isinstance(item, slice):
                raise CompilationError("tiles can only be indexed with slices and None (e.g. x[:, None], "
                                       f"x[16:32, :]); got {describe(item)}")
        if len(sliced) > len(x.shape):
            raise CompilationError(f"too many indices for a tile of shape {x.shape}")
        if any(item != slice(None) for item in sliced):
            bounds = [(i.start, i.stop, i.step) for i in sliced] + [None] * (len(x.shape) - len(sliced))
            x = self.sem.extract_slice(x, bounds)
        dim = 0
        for item in index:
            if item is None:
                x = self.sem.expand_dims(x, dim)
            dim += 1
        return x

    # ------------------------------------------------------------------------------------- calls

    def expr_Call(self, node: ast.Call) -> Any:
        fn = self.expr(node.func)
        args = []
        for a in node.args:
            if isinstance(a, ast.Starred):
                v = self.expr(a.value)
                if not isinstance(v, (tuple, list)):
                    raise CompilationError("only compile-time tuples can be unpacked with *")
                args.extend(v)
            else:
                args.append(self.expr(a))
        kwargs = {}
        for k in node.keywords:
            if k.arg is None:
                raise CompilationError("**kwargs in calls are not supported")
            kwargs[k.arg] = self.expr(k.value)
        return self.call(fn, args, kwargs, node)

    def call(self, fn: Any, args: list[Any], kwargs: dict[str, Any], node: ast.Call) -> Any:
        if getattr(fn, "__mt_builtin__", False):
            return fn.__wrapped__(*args, _sem=self.sem, **kwargs)
        if isinstance(fn, BoundMethod):
            return fn.fn(*args, **kwargs)
        if isinstance(fn, InlineFunction):
            return self.inline(fn, args, kwargs, node)
        if fn is range:
            return RangeCall.make(args, kwargs)
        if fn is mtl.static_range:
            return mtl.static_range(*args)
        if fn in (mtl.warp_specialize, mtl.partition, mtl.blocked):
            if any(isinstance(a, TileValue) for a in list(args) + list(kwargs.values())):
                raise CompilationError(f"mt.{fn.__name__} takes compile-time values")
            return fn(*args, **kwargs)
        if getattr(fn, "__mt_kernel__", False):
            raise CompilationError(f"cannot call the kernel '{fn.__name__}' from a kernel; make the shared code "
                                   "an @mt.func")
        if isinstance(fn, ScalarType):
            if len(args) != 1 or kwargs:
                raise CompilationError(f"{fn}(x) takes one value")
            return self.sem.cast(args[0], fn)
        if fn in PY_BUILTINS.values():
            if any(isinstance(a, TileValue) for a in list(args) + list(kwargs.values())):
                return self.python_builtin_on_values(fn, args, kwargs)
            return fn(*args, **kwargs)
        if isinstance(fn, type(math.sqrt)) and getattr(fn, "__module__", None) == "math":
            if any(isinstance(a, TileValue) for a in args):
                raise CompilationError(f"math.{fn.__name__} works on compile-time values only; use mt.{fn.__name__}")
            return fn(*args, **kwargs)
        name = getattr(fn, "__name__", repr(fn))
        raise CompilationError(f"cannot call '{name}' from kernel code: only mt builtins, @mt.func helpers and "
                               "Python builtins on compile-time values can be called")

    def python_builtin_on_values(self, fn: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
        if fn in (builtins.min, builtins.max) and len(args) == 2 and not kwargs:
            return self.sem.binary("minimum" if fn is builtins.min else "maximum", args[0], args[1])
        if fn is builtins.abs and len(args) == 1:
            return self.sem.abs(args[0])
        if fn in (builtins.int, builtins.float, builtins.bool) and len(args) == 1:
            raise CompilationError(f"{fn.__name__}() works on compile-time values; use x.to(mt.int32) etc.")
        raise CompilationError(f"{fn.__name__}() cannot take runtime values")

    def inline(self, fn: InlineFunction, args: list[Any], kwargs: dict[str, Any], node: ast.Call) -> Any:
        if len(self.frames) > self.MAX_INLINE_DEPTH:
            raise CompilationError(f"@mt.func calls nest deeper than {self.MAX_INLINE_DEPTH} (recursion?)")
        src = fn.source
        fdef = src.tree
        a = fdef.args
        if a.vararg or a.kwarg:
            raise CompilationError(f"@mt.func '{fdef.name}' uses *args/**kwargs, which are not supported")
        params = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
        if len(args) > len(a.posonlyargs + a.args):
            raise CompilationError(f"'{fdef.name}' takes {len(a.posonlyargs + a.args)} positional arguments but "
                                   f"{len(args)} were given")
        bound: dict[str, Any] = dict(zip(params, args))
        for k, v in kwargs.items():
            if k not in params:
                raise CompilationError(f"'{fdef.name}' got an unexpected keyword argument '{k}'")
            if k in bound:
                raise CompilationError(f"'{fdef.name}' got multiple values for argument '{k}'")
            bound[k] = v
        positional = a.posonlyargs + a.args
        defaults = dict(zip([p.arg for p in positional[len(positional) - len(a.defaults):]], a.defaults))
        defaults.update({p.arg: d for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None})
        self.frames.append(Frame(src, {}, self.region_depth))
        try:
            for p in params:
                if p not in bound:
                    if p not in defaults:
                        raise CompilationError(f"'{fdef.name}' is missing the argument '{p}'")
                    bound[p] = self.expr(defaults[p])
            self.frame.scope.update(bound)
            try:
                self.visit_body(fold_early_returns(fdef.body))
            except _Return as r:
                return r.value
            return None
        finally:
            self.frames.pop()


class _NoDefault:
    def __repr__(self) -> str:
        return "<no default>"


_NO_DEFAULT = _NoDefault()


class RangeCall:
    """range(start, stop, step) with compile-time or runtime bounds, consumed by a `for` loop."""

    def __init__(self, start: Any, stop: Any, step: Any):
        self.start, self.stop, self.step = start, stop, step

    @classmethod
    def make(cls, args: list[Any], kwargs: dict[str, Any]) -> "RangeCall":
        if kwargs or not 1 <= len(args) <= 3:
            raise CompilationError("range() takes 1 to 3 positional arguments")
        if len(args) == 1:
            return cls(0, args[0], 1)
        return cls(args[0], args[1], args[2] if len(args) == 3 else 1)


def compile_function(fn: Callable[..., Any], arg_types: dict[str, Type], constexprs: dict[str, Any], *,
                     divisibility: dict[str, int] | None = None, equal_to_one: set[str] | None = None,
                     num_warps: int = 4) -> Module:
    """Compile one specialization of a kernel function into a Module holding one `mt.func`."""
    fn = getattr(fn, "fn", fn)  # a runtime Kernel wraps the function
    compiler = KernelCompiler(function_source(fn))
    func = compiler.compile(dict(arg_types), dict(constexprs), dict(divisibility or {}), set(equal_to_one or ()),
                            num_warps)
    return Module([func])
