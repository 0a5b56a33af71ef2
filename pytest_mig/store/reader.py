"""The strict reader of baseline history files (and of shipped references, which are such files).

A file is checked against its schema (:data:`pytest_mig.store.schemas.BASELINE`, or ``BASELINE_V1``
for the older version 1 that :mod:`pytest_mig.store.legacy` reads) before any field is used, then for
what a schema cannot say; a hand-broken file is a :class:`~pytest_mig.store.history.BaselineError`
naming the file and the problem.  Only ``json`` is used: no pickle, no eval.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from pytest_mig.common.files import FileProblem, parse_json, read_json, validate
from pytest_mig.common.text import quoted
from pytest_mig.device.profiles import model_slug
from pytest_mig.device.target import EMULATED_SUFFIX
from pytest_mig.measure.metric import batch_bound
from pytest_mig.store.history import (
    ADVICE,
    BASELINE_SCHEMA,
    DEFAULT_KEEP,
    Baseline,
    BaselineEntry,
    BaselineError,
    BaselineMeta,
    EntryKey,
    Run,
    check_fingerprint,
    check_header,
    check_number,
    check_size,
    check_throttled,
)
from pytest_mig.store.legacy import BASELINE_SCHEMA_V1, read_v1
from pytest_mig.store.results import MODES
from pytest_mig.store.schemas import BASELINE, BASELINE_V1


def load_baseline_file(path: Path) -> Baseline:
    """Read and check one baseline file (schema 2, or schema 1 read as one run per figure)."""
    path = Path(path)
    try:
        doc = read_json(path, allow_nan=True)  # a NaN figure is named by the checks below, in the store's words
    except FileProblem as exc:
        raise BaselineError(f"{exc}; {ADVICE}") from None
    return parse_baseline(doc, path)


def check_baseline_text(path: Path) -> Callable[[str], Baseline]:
    """A check for :func:`~pytest_mig.common.files.atomic_write_text`: the text about to become ``path`` read
    back as :func:`load_baseline_file` will read it, so that a file its own reader refuses is never
    written."""
    def check(text: str) -> Baseline:
        try:
            doc = parse_json(text, str(path))
        except FileProblem as exc:
            raise BaselineError(f"not saved, the text would not read back: {exc}") from None
        return parse_baseline(doc, path)
    return check


def parse_baseline(doc: Any, path: Path) -> Baseline:
    """A baseline file's parsed JSON, checked against its schema (:data:`pytest_mig.store.schemas.BASELINE`)
    before any field is used, then for what a schema cannot say (the folder and name matching its GPU
    model and profile, fingerprints the runs name)."""
    if not isinstance(doc, dict):
        raise BaselineError(f"{path}: not a baseline file (a JSON object is expected at the top); {ADVICE}")
    schema = doc.get("schema")
    if schema not in (BASELINE_SCHEMA, BASELINE_SCHEMA_V1):
        raise BaselineError(f"{path}: schema is {json.dumps(schema)}, expected \"{BASELINE_SCHEMA}\"; {ADVICE}")
    try:
        validate(doc, BASELINE if schema == BASELINE_SCHEMA else BASELINE_V1, str(path))
    except FileProblem as exc:
        try:  # the checks below name most problems in the store's own words: say it so where they can
            _parse_valid(doc, path, schema)
        except BaselineError as named:
            raise named from None
        except Exception:  # noqa: BLE001  (they assume a file that passed the schema: its words stand)
            pass
        raise BaselineError(f"{exc}; {ADVICE}") from None
    return _parse_valid(doc, path, schema)


def _parse_valid(doc: dict[str, Any], path: Path, schema: str) -> Baseline:
    body_key = "modes" if schema == BASELINE_SCHEMA else "tests"
    for key, typ, name in (("gpu_model", str, "a string"), ("gpu_slug", str, "a string"),
                           ("profile", str, "a string"), ("emulated", bool, "true or false"),
                           (body_key, dict, "an object")):
        if not isinstance(doc.get(key), typ):
            raise BaselineError(f"{path}: {quoted(key)} must be {name}, found {json.dumps(doc.get(key))}; {ADVICE}")
    folder = path.parent.name
    if doc["gpu_slug"] != folder or model_slug(doc["gpu_model"]) != folder:
        raise BaselineError(
            f"{path}: recorded on GPU model {quoted(doc['gpu_model'])} ({quoted(doc['gpu_slug'])}) but kept in folder "
            f"{quoted(folder)}; a baseline of another GPU model is never used, move it to its own folder"
        )
    if doc["profile"] != path.stem:
        raise BaselineError(f"{path}: recorded for profile {quoted(doc['profile'])} but named {quoted(path.name)}; "
                            "rename or fix it")
    if doc["emulated"] != doc["profile"].endswith(EMULATED_SUFFIX):
        raise BaselineError(
            f"{path}: 'emulated' is {json.dumps(doc['emulated'])} but the profile is '{doc['profile']}'; "
            f"emulated baselines are named <profile>{EMULATED_SUFFIX}"
        )
    meta = BaselineMeta(doc["gpu_model"], doc["gpu_slug"], doc["profile"], doc["emulated"], {}, path)
    if schema == BASELINE_SCHEMA:
        keep = doc.get("keep", DEFAULT_KEEP)
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise BaselineError(f"{path}: 'keep' is {json.dumps(keep)}; use a whole number of runs, 1 or more")
        entries = _read_v2(path, doc)
    else:
        keep, entries = DEFAULT_KEEP, read_v1(path, doc)
    newest = max((e.last for e in entries.values() if e.last), key=lambda r: r.recorded_at, default=None)
    meta.fingerprint = dict(newest.fingerprint) if newest else {}
    extra = {"reference": doc["reference"]} if "reference" in doc else {}  # a shipped reference's block
    retired = {key: entries.pop(key) for key in [k for k in entries if batch_bound(k[0], k[1])]}
    return Baseline(meta, entries, str(doc.get("updated_at") or ""), keep, extra, retired)


def _read_v2(path: Path, doc: dict[str, Any]) -> dict[EntryKey, BaselineEntry]:
    fps_raw = doc.get("fingerprints") or {}
    if not isinstance(fps_raw, dict):
        raise BaselineError(f"{path}: 'fingerprints' must be an object; {ADVICE}")
    fps = {str(k): check_fingerprint(path, f"fingerprint {quoted(k)}", v) for k, v in fps_raw.items()}
    entries: dict[EntryKey, BaselineEntry] = {}
    for mode, tests in doc["modes"].items():
        if mode not in MODES:
            raise BaselineError(f"{path}: mode {json.dumps(mode)}; use \"normal\" or \"quick\"")
        if not isinstance(tests, dict):
            raise BaselineError(f"{path}: mode {quoted(mode)} must map tests to their figures; {ADVICE}")
        for test, metrics in tests.items():
            if not isinstance(metrics, dict):
                raise BaselineError(f"{path}: test {quoted(test)} must map metric names to entries; {ADVICE}")
            for name, e in metrics.items():
                where = f"test {quoted(test)} metric {quoted(name)} ({mode})"
                unit, direction, kind, tol = check_header(path, where, e)
                runs_raw = e.get("runs")
                if not isinstance(runs_raw, list) or not runs_raw:
                    raise BaselineError(f"{path}: {where} needs 'runs', a list of at least one run; {ADVICE}")
                runs = []
                for r in runs_raw:
                    if not isinstance(r, dict) or "value" not in r:
                        raise BaselineError(f"{path}: {where} has a run without a 'value'; {ADVICE}")
                    fp_id = r.get("fp")
                    if fp_id is not None and fp_id not in fps:
                        raise BaselineError(f"{path}: {where} names fingerprint {json.dumps(fp_id)}, which the "
                                            f"file's 'fingerprints' does not hold; {ADVICE}")
                    noise = r.get("noise")
                    runs.append(Run(
                        value=check_number(path, f"{where} run value", r["value"], positive=True),
                        recorded_at=str(r.get("at") or ""),
                        fingerprint=dict(fps[fp_id]) if fp_id is not None else {},
                        noise=None if noise is None else abs(check_number(path, f"{where} run noise", noise)),
                        throttled=check_throttled(path, where, r.get("throttled")),
                        clock_mhz=None if r.get("clock_mhz") is None else check_number(path, f"{where} run clock_mhz",
                                                                                 r["clock_mhz"], positive=True),
                        size=check_size(path, f"{where} run size", r.get("size")),
                        temperature_c=None if r.get("temperature_c") is None else check_number(
                            path, f"{where} run temperature_c", r["temperature_c"]),
                    ))
                entries[(test, name, mode)] = BaselineEntry(test, name, unit, direction, kind, tol, runs, mode)
    return entries


__all__ = ["check_baseline_text", "load_baseline_file", "parse_baseline"]
