"""Typed dataclass configs as command lines: one flag per field, help from the field docstrings."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def field_docs(cls: type) -> dict[str, str]:
    """Docstrings written under each field (the attribute-docstring convention)."""
    docs: dict[str, str] = {}
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    for node, following in zip(body, body[1:], strict=False):
        if isinstance(node, ast.AnnAssign) and isinstance(following, ast.Expr):
            value = following.value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docs[node.target.id] = value.value  # type: ignore[union-attr]
    return docs


def _base_type(annotation: Any) -> Any:
    """`int | None` -> int; `bool` stays bool."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0]
    return annotation


def parse_dataclass(cls: type[T], argv: list[str] | None = None, description: str | None = None) -> T:
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    parser = argparse.ArgumentParser(description=description or cls.__doc__)
    for field in dataclasses.fields(cls):
        flag = "--" + field.name.replace("_", "-")
        kind = _base_type(hints[field.name])
        required = field.default is dataclasses.MISSING
        default = None if required else field.default
        help_text = docs.get(field.name, "")
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        else:
            parser.add_argument(flag, type=kind, default=default, required=required, help=help_text)
    return cls(**vars(parser.parse_args(argv)))
