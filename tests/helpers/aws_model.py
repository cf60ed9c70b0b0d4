"""A request checked against an AWS API's own service model, as botocore ships it: botocore's parameter validator
(types, required members, minimum lengths and values: botocore/validate.py), then the constraints that validator
leaves to the service (maximum lengths and counts, patterns, enums), read from the same shapes. A request that
passes here is one the service's front end accepts as well formed; what the service then does with it is the
stand-ins' business.

Patterns are Smithy's (ECMAScript flavoured, unanchored in the model; the services match them whole, so here they
must match the whole value); `\\p{L}`, `\\p{Z}` and `\\p{N}` become their ASCII cores, as Python's `re` lacks them.
"""

from __future__ import annotations

import re
from functools import cache

import botocore.session
from botocore.validate import ParamValidator

UNICODE_CLASSES = {r"\p{L}": "a-zA-Z", r"\p{Z}": " ", r"\p{N}": "0-9"}


@cache
def operation_input(service: str, operation: str):
    return botocore.session.get_session().get_service_model(service).operation_model(operation).input_shape


def _pattern(text: str) -> re.Pattern:
    for name, ascii_core in UNICODE_CLASSES.items():
        text = text.replace(name, ascii_core)
    return re.compile(text)


def problems(service: str, operation: str, params: dict) -> list[str]:
    """What the service's model refuses in `params` (empty: accepted)."""
    shape = operation_input(service, operation)
    report = ParamValidator().validate(params, shape)
    found = [report.generate_report()] if report.has_errors() else []
    _walk(shape, params, operation, found)
    return found


def _walk(shape, value, where: str, found: list[str]) -> None:
    meta = shape.metadata
    if shape.type_name == "structure" and isinstance(value, dict):
        for name, member in value.items():
            if name in shape.members:
                _walk(shape.members[name], member, f"{where}.{name}", found)
    elif shape.type_name == "list" and isinstance(value, list):
        if "max" in meta and len(value) > meta["max"]:
            found.append(f"{where}: {len(value)} items, at most {meta['max']}")
        for index, item in enumerate(value):
            _walk(shape.member, item, f"{where}[{index}]", found)
    elif shape.type_name == "map" and isinstance(value, dict):
        if "max" in meta and len(value) > meta["max"]:
            found.append(f"{where}: {len(value)} entries, at most {meta['max']}")
        for key, item in value.items():
            _walk(shape.key, key, f"{where} key {key!r}", found)
            _walk(shape.value, item, f"{where}[{key!r}]", found)
    elif shape.type_name == "string" and isinstance(value, str):
        if "max" in meta and len(value) > meta["max"]:
            found.append(f"{where}: {len(value)} characters, at most {meta['max']}")
        if shape.enum and value not in shape.enum:
            found.append(f"{where}: {value!r} is not one of the model's {len(shape.enum)} values")
        if "pattern" in meta and not _pattern(meta["pattern"]).fullmatch(value):
            found.append(f"{where}: {value!r} does not match {meta['pattern']!r}")
    elif shape.type_name in ("integer", "long") and isinstance(value, int):
        if "max" in meta and value > meta["max"]:
            found.append(f"{where}: {value} is above {meta['max']}")
