"""One JSON schema per file type pytest-mig reads: results files, baseline histories (schema 1 and
2) and references (a baseline with a ``reference`` block).

They say what every field holds, so that a reader checks a file once (:func:`pytest_mig.common.files.validate`)
before it uses any field, and a malformed file is one sentence naming where it is wrong rather than a
traceback in whatever code first touched the field.  What a schema cannot say (a baseline's folder
matching its GPU model, a fingerprint id that the file's table holds) the readers check after it.

Numbers are bounded: a figure, a noise, a duration or a sigma within :data:`~pytest_mig.common.files.MAX_NUMBER`
(1e300, so that no square or ratio of two overflows a float), a count or a run total a bounded integer.
A results file's measured values are not bounded (a run writes what it measured, NaN and infinity
included, and the verdict layer names them); the strict reader still refuses a number no float holds.
"""

from __future__ import annotations

from typing import Any

from pytest_mig.common.files import MAX_NUMBER, MAX_SIZE
from pytest_mig.measure import METRIC_KINDS
from pytest_mig.measure.clocks import TEMPERATURE_RANGE

_NUMBER = {"type": "number"}
#: A number a history or reference keeps: within MAX_NUMBER either side of 0.
_BOUNDED = {"type": "number", "minimum": -MAX_NUMBER, "maximum": MAX_NUMBER}
_OPT_BOUNDED = {"type": ["number", "null"], "minimum": -MAX_NUMBER, "maximum": MAX_NUMBER}
#: A figure a history keeps: above 0 and within MAX_NUMBER.
_FIGURE = {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_NUMBER}
#: Most runs, a keep or a count any file holds.
MAX_COUNT = 10**6
_COUNT = {"type": "integer", "minimum": 0, "maximum": MAX_COUNT}
_OPT_NUMBER = {"type": ["number", "null"]}
_OPT_STRING = {"type": ["string", "null"]}
_DIRECTION = {"enum": ["higher", "lower"]}
_MODE = {"enum": ["normal", "quick"]}
_STRINGS = {"type": "array", "items": {"type": "string"}}
_NUMBERS = {"type": "array", "items": _NUMBER}

#: A verdict as :class:`pytest_mig.store.verdicts.Verdict` writes it; fields other tools added are not read.
VERDICT: dict[str, Any] = {
    "type": ["object", "null"],
    "required": ["outcome"],
    "properties": {
        "outcome": {"type": "string"}, "metric": _OPT_STRING, "value": _OPT_NUMBER, "baseline": _OPT_NUMBER,
        "change_pct": _OPT_NUMBER, "tolerance": _OPT_NUMBER, "threshold": _OPT_NUMBER, "sigma": _OPT_NUMBER,
        "detectable": _OPT_NUMBER, "runs": {"type": ["integer", "null"]}, "gates": {"type": ["boolean", "null"]},
        "confirmations": _NUMBERS, "fingerprint_changes": _STRINGS, "throttled": _STRINGS,
        "message": {"type": "string"}, "unit": {"type": "string"}, "test": {"type": "string"},
        "failed": {"type": "boolean"}, "direction": _DIRECTION, "basis": _OPT_STRING, "source": {"type": "string"},
        "sigma_of": _OPT_STRING, "at_temperature": _OPT_STRING, "warmth": _OPT_STRING,
    },
}

_OPT_INTEGER = {"type": ["integer", "null"]}

#: A Target as :class:`pytest_mig.device.target.TargetInfo` writes it: the keys it reads typed, any other left alone.
TARGET: dict[str, Any] = {
    "type": ["object", "null"],
    "properties": {
        **{k: _OPT_STRING for k in ("kind", "profile", "baseline_profile", "chosen_by", "gpu_name", "gpu_slug", "uuid",
                                    "verified")},
        **{k: _OPT_INTEGER for k in ("sms", "sms_obtained", "memory_bytes", "gpu_index")},
        "emulated": {"type": ["boolean", "null"]},
    },
}

METRIC: dict[str, Any] = {
    "type": "object",
    "required": ["name", "value", "unit"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1}, "value": _NUMBER, "unit": {"type": "string"},
        "direction": _DIRECTION, "samples": _NUMBERS, "kind": {"enum": list(METRIC_KINDS)},
        "info": {"type": "object"}, "compare": {"type": "boolean"}, "stats": {"type": ["object", "null"]},
    },
}

RECORD: dict[str, Any] = {
    "type": "object",
    "required": ["test", "metric"],
    "properties": {
        "test": {"type": "string", "minLength": 1}, "metric": METRIC, "target": TARGET,
        "fingerprint": {"type": ["object", "null"]}, "timestamp": {"type": "string"}, "node": {"type": "string"},
        "verdict": VERDICT, "mode": _MODE, "health": {"type": ["object", "null"]},
    },
}

RESULTS: dict[str, Any] = {
    "type": "object",
    "required": ["schema", "records"],
    "properties": {
        "schema": {"const": "pytest-mig/results/1"},
        "meta": {"type": ["object", "null"], "properties": {
            "complete": {"type": "boolean"}, "stopped": {"type": "string"},
            "durations": {"type": "object", "additionalProperties": {"type": "number", "minimum": 0,
                                                                       "maximum": MAX_NUMBER}},
            "window": {"type": "object", "properties": {
                "seconds": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": MAX_NUMBER},
                "left": {"type": "array", "items": {"type": "string"}}}},
            "left_out": {"type": "array", "items": {"type": "string"}},
        }},
        "records": {"type": "array", "items": RECORD},
    },
}

_HEADER = {
    "unit": {"type": "string"}, "direction": _DIRECTION, "kind": {"enum": [None, *METRIC_KINDS]},
    "tolerance": {"type": ["number", "null"], "minimum": 0, "exclusiveMaximum": 1},
}

RUN: dict[str, Any] = {
    "type": "object",
    "required": ["value"],
    "properties": {
        "value": _FIGURE, "at": _OPT_STRING, "fp": _OPT_STRING,
        "noise": _OPT_BOUNDED, "throttled": {"type": ["array", "null"], "items": {"type": "string"}},
        "clock_mhz": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": MAX_NUMBER},
        "size": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_SIZE},
        "temperature_c": {"type": ["number", "null"], "minimum": TEMPERATURE_RANGE[0], "maximum": TEMPERATURE_RANGE[1]},
    },
}

ENTRY: dict[str, Any] = {
    "type": "object",
    "required": ["unit", "direction", "runs"],
    "properties": {**_HEADER, "runs": {"type": "array", "minItems": 1, "items": RUN}},
}

_SIGMA = {"type": "object", "additionalProperties": {"type": "object", "additionalProperties": {
    "type": "object", "additionalProperties": {"type": "number", "minimum": 0, "maximum": MAX_NUMBER}}}}

_COMMON = {
    "gpu_model": {"type": "string"}, "gpu_slug": {"type": "string"}, "profile": {"type": "string"},
    "emulated": {"type": "boolean"}, "updated_at": {"type": ["string", "null"]},
}

BASELINE: dict[str, Any] = {
    "type": "object",
    "required": ["schema", "gpu_model", "gpu_slug", "profile", "emulated", "modes"],
    "properties": {
        **_COMMON,
        "schema": {"const": "pytest-mig/baseline/2"},
        "keep": {"type": "integer", "minimum": 1, "maximum": MAX_COUNT},
        "fingerprints": {"type": ["object", "null"], "additionalProperties": {"type": "object"}},
        "modes": {"type": "object", "propertyNames": _MODE, "additionalProperties": {
            "type": "object", "additionalProperties": {"type": "object", "additionalProperties": ENTRY}}},
        "reference": {"type": "object"},  # REFERENCE, checked by the reference reader
    },
}

#: The block a reference adds to a baseline file: each figure's pooled sigma (across boards and
#: within one), and runs per mode.
REFERENCE: dict[str, Any] = {
    "type": "object",
    "properties": {"sigma": _SIGMA, "board_sigma": _SIGMA, "runs": {"type": "object", "additionalProperties": _COUNT}},
}

BASELINE_V1: dict[str, Any] = {
    "type": "object",
    "required": ["schema", "gpu_model", "gpu_slug", "profile", "emulated", "tests"],
    "properties": {
        **_COMMON,
        "schema": {"const": "pytest-mig/baseline/1"},
        "fingerprint": {"type": ["object", "null"]},
        "tests": {"type": "object", "additionalProperties": {"type": "object", "additionalProperties": {
            "type": "object", "required": ["unit", "direction", "value"],
            "properties": {**_HEADER, "value": _FIGURE, "mode": _MODE,
                           "samples": {"type": "array", "items": _BOUNDED}, "fingerprint": {"type": ["object", "null"]},
                           "recorded_at": _OPT_STRING,
                           "throttled": {"type": ["array", "null"], "items": {"type": "string"}}}}}},
    },
}

__all__ = ["BASELINE", "BASELINE_V1", "MAX_COUNT", "METRIC", "RECORD", "REFERENCE", "RESULTS", "TARGET", "VERDICT"]
