"""The tile IR: types, ops, printer, parser and verifier."""
from .core import Block, Builder, Location, Module, Operation, Region, Value, function_body, make_function
from .ops import OPS, OpSpec, VerifyError
from .parser import ParseError, parse_module, parse_type
from .printer import print_module, print_op
from .types import (FunctionType, LayoutAttr, PointerType, ScalarType, TensorType, Type, SCALAR_TYPES,
                    TRITON_SPELLINGS, layout, tensor, with_scalar, with_shape)
from .verifier import verify

__all__ = [
    "Block", "Builder", "Location", "Module", "Operation", "Region", "Value", "function_body", "make_function",
    "OPS", "OpSpec", "VerifyError", "ParseError", "parse_module", "parse_type", "print_module", "print_op",
    "FunctionType", "LayoutAttr", "PointerType",
    "ScalarType", "TensorType", "Type", "SCALAR_TYPES", "TRITON_SPELLINGS", "layout", "tensor", "with_scalar",
    "with_shape", "verify",
]
