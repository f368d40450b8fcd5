"""The frontend: Python AST -> tile IR (ast_to_ir.py), with the language's semantics in semantic.py."""
from .ast_to_ir import compile_function as compile_to_ir
from .source import InlineFunction, func

__all__ = ["compile_to_ir", "InlineFunction", "func"]
