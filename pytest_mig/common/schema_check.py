"""A JSON schema compiled into plain Python checks: the yes-or-no answer jsonschema gives, fast enough
for a fleet's results files (a thousand nights of 250 records each).

Only the keywords pytest-mig's own schemas use are compiled (``type``, ``properties``,
``additionalProperties``, ``required``, ``items``, ``enum``, ``const``, ``minimum``, ``maximum``,
``exclusiveMinimum``, ``exclusiveMaximum``, ``minLength``, ``minItems``, ``propertyNames``), with Draft
2020-12's meaning (a bool is not a number; 1.0 is an integer; bounds and lengths apply only to numbers,
strings or arrays).  A schema with any other keyword is not compiled (:func:`compile_schema` returns
None), and the caller asks jsonschema.  A document the checks refuse goes to jsonschema too, for the
sentence that names where it is wrong; so the checks only ever decide that a document is valid.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

Check = Callable[[Any], bool]

KEYWORDS = frozenset({"type", "properties", "additionalProperties", "required", "items", "enum", "const", "minimum",
                      "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "minItems", "propertyNames"})


class Unsupported(Exception):
    """A schema keyword this module does not compile."""


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_integer(x: Any) -> bool:
    return _is_number(x) and (isinstance(x, int) or x.is_integer())


_TYPES: dict[str, Check] = {
    "object": lambda x: isinstance(x, dict), "array": lambda x: isinstance(x, list),
    "string": lambda x: isinstance(x, str), "boolean": lambda x: isinstance(x, bool),
    "null": lambda x: x is None, "number": _is_number, "integer": _is_integer,
}

#: The exact Python types json gives each JSON type: a value of one of them is of that type without
#: further checks (a value of any other type, an int subclass, a float 1.0 for "integer", gets the full
#: check of _TYPES).
_EXACT: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "boolean": (bool,), "null": (type(None),),
    "number": (int, float), "integer": (int,),
}


def _all_of(checks: list[Check]) -> Check:
    """One check that is True where every one of ``checks`` is (the common small cases without a loop)."""
    if not checks:
        return lambda x: True
    if len(checks) == 1:
        return checks[0]
    if len(checks) == 2:
        a, b = checks
        return lambda x: a(x) and b(x)
    return lambda x: all(c(x) for c in checks)


def _equal(a: Any, b: Any) -> bool:
    """JSON equality as jsonschema judges ``enum`` and ``const``: a bool equals only a bool."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (dict, list)) or isinstance(b, (dict, list)):
        return False  # the compiled options are scalars (_scalars): an object or array equals none
    return type(a) is type(b) and a == b or (_is_number(a) and _is_number(b) and a == b)


def _scalars(options: list[Any]) -> list[Any]:
    if any(isinstance(o, (dict, list)) for o in options):
        raise Unsupported("enum or const of an object or array")
    return options


def _type_check(spec: Any) -> Check:
    names = [spec] if isinstance(spec, str) else list(spec)
    checks = [_TYPES[n] for n in names]
    if names in (["object"], ["array"], ["string"], ["boolean"], ["null"]):
        return checks[0]
    exact = frozenset(t for n in names for t in _EXACT[n])
    if len(checks) == 1:
        only = checks[0]
        return lambda x: type(x) in exact or only(x)
    return lambda x: type(x) in exact or any(c(x) for c in checks)


def _bounds(s: Mapping[str, Any]) -> list[Check]:
    out: list[Check] = []
    if "minimum" in s:
        lo = s["minimum"]
        out.append(lambda x: not _is_number(x) or not x < lo)
    if "maximum" in s:
        hi = s["maximum"]
        out.append(lambda x: not _is_number(x) or not x > hi)
    if "exclusiveMinimum" in s:
        elo = s["exclusiveMinimum"]
        out.append(lambda x: not _is_number(x) or not x <= elo)
    if "exclusiveMaximum" in s:
        ehi = s["exclusiveMaximum"]
        out.append(lambda x: not _is_number(x) or not x >= ehi)
    if "minLength" in s:
        n = s["minLength"]
        out.append(lambda x: not isinstance(x, str) or len(x) >= n)
    if "minItems" in s:
        k = s["minItems"]
        out.append(lambda x: not isinstance(x, list) or len(x) >= k)
    return out


def _object_check(s: Mapping[str, Any]) -> Check | None:
    props = {k: _compile(v) for k, v in (s.get("properties") or {}).items()}
    extra = s.get("additionalProperties", True)
    extra_check: Check | None = None if extra is True else (lambda x: False) if extra is False else _compile(extra)
    names = _compile(s["propertyNames"]) if "propertyNames" in s else None
    required = frozenset(s.get("required", ()))
    if not props and extra_check is None and names is None and not required:
        return None
    get = props.get

    def check(x: Any) -> bool:
        if not isinstance(x, dict):
            return True
        if not x.keys() >= required:
            return False
        for k, v in x.items():
            c = get(k, extra_check)
            if c is not None and not c(v):
                return False
        return names is None or all(map(names, x))
    return check


def _array_check(s: Mapping[str, Any]) -> Check | None:
    if "items" not in s:
        return None
    item = _compile(s["items"])
    if set(s["items"]) == {"type"} and isinstance(s["items"]["type"], str):  # a list of numbers or strings
        exact = frozenset(_EXACT[s["items"]["type"]])
        # the types of a sample list's thousand numbers gathered without a call per number
        return lambda x: not isinstance(x, list) or set(map(type, x)) <= exact or all(map(item, x))
    return lambda x: not isinstance(x, list) or all(item(v) for v in x)


def _compile(s: Any) -> Check:
    if s is True or s == {}:
        return lambda x: True
    if s is False:
        return lambda x: False
    if not isinstance(s, Mapping) or set(s) - KEYWORDS:
        raise Unsupported(str(sorted(set(s) - KEYWORDS)) if isinstance(s, Mapping) else repr(s))
    checks: list[Check] = []
    if "type" in s:
        checks.append(_type_check(s["type"]))
    if "enum" in s:
        options = _scalars(list(s["enum"]))
        words = frozenset(o for o in options if isinstance(o, str))
        checks.append(lambda x: (type(x) is str and x in words) or any(_equal(x, e) for e in options))
    if "const" in s:
        (const,) = _scalars([s["const"]])
        checks.append(lambda x: _equal(x, const))
    checks.extend(_bounds(s))
    checks.extend(c for c in (_object_check(s), _array_check(s)) if c is not None)
    return _all_of(checks)


def compile_schema(schema: Mapping[str, Any]) -> Check | None:
    """A function that is True where ``schema`` holds of a document, or None for a schema with a
    keyword it does not compile."""
    try:
        return _compile(schema)
    except Unsupported:
        return None


__all__ = ["compile_schema"]
