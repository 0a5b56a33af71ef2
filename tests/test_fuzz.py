"""No input ends in a traceback: every file reader and every option parser, fed generated inputs
(hypothesis), either reads the input or says what is wrong in one sentence of its own error type.

Files are made by mutating real ones (a results file the plugin wrote, a shipped reference, a
baseline history): one node anywhere in the document is replaced by any JSON value, so the readers
meet the malformed fields a careless edit or a hostile file would hold, at every depth.  The
commands that read results files (compare, report, reference, history) run on them end to end."""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any, Callable

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pytest_mig import cli  # noqa: E402
from pytest_mig.cli.common import factor_arg, path_arg, runs_arg  # noqa: E402
from pytest_mig.store.baselines import BaselineStore  # noqa: E402
from pytest_mig.store.history import BaselineError
from pytest_mig.store.reader import load_baseline_file
from pytest_mig.measure.cost import SUCoefficients  # noqa: E402
from pytest_mig.report.exports import parse_export  # noqa: E402
from pytest_mig.common.files import MAX_DEPTH, FileProblem, check_path, parse_json, path_problem  # noqa: E402
from pytest_mig.common.nesting import depth, text_depth  # noqa: E402
from pytest_mig.report.trend import collect  # noqa: E402
from pytest_mig.measure import Metric  # noqa: E402
from pytest_mig.device.profiles import ProfileError, parse_profile  # noqa: E402
from pytest_mig.judge.reference import SHIPPED, ReferenceStore  # noqa: E402
from pytest_mig.device.target import TargetInfo
from pytest_mig.store.verdicts import Verdict
from pytest_mig.store.results import ResultRecord, ResultsFileError, read_results_file, write_results  # noqa: E402
from pytest_mig.settings import count_arg, positive_int_arg, tolerance_arg  # noqa: E402
from pytest_mig.night.nights import last_runs  # noqa: E402
from pytest_mig.night.window import merge_meta, window_arg  # noqa: E402

FUZZ = settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "60")), deadline=None, suppress_health_check=list(HealthCheck))
#: Names the files use, so that generated objects often hit real fields.
KEYS = st.sampled_from(["schema", "records", "meta", "test", "metric", "name", "value", "unit", "direction",
                        "samples", "kind", "info", "compare", "verdict", "outcome", "change_pct", "baseline",
                        "confirmations", "target", "fingerprint", "mode", "modes", "runs", "at", "fp", "noise",
                        "throttled", "keep", "gpu_model", "gpu_slug", "profile", "emulated", "reference", "sigma",
                        "fingerprints", "tolerance", "normal", "quick"]) | st.text(max_size=8)
#: Numbers of any size: huge integers (past a float, and past 30 digits), the extremes of a float,
#: -0.0 and subnormals.
NUMBERS = (st.integers(min_value=-10**20, max_value=10**20) | st.integers(min_value=-10**400, max_value=10**400)
           | st.floats(allow_nan=True, allow_infinity=True)
           | st.sampled_from([-0.0, 1e-320, 5e-324, -5e-324, 1e-300, 1e300, 1.0000001e300, 1.7976931348623157e308,
                              -1.7976931348623157e308, 10**29, 10**30, -(10**30)]))
#: Strings of any character (NUL, lone surrogates, escape sequences) and any length.
TEXTS = (st.text(max_size=12) | st.text(st.characters(codec=None), max_size=40)
         | st.sampled_from(["\x00", "\ud800", "\x1b[31m", "\r\n", "..", "../..", "a/b", "x" * 300, "é" * 5000]))
SCALARS = st.none() | st.booleans() | NUMBERS | TEXTS
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
                    max_leaves=20)
TARGET = {"kind": "full", "profile": "full", "baseline_profile": "full", "gpu_name": "NVIDIA H200",
          "gpu_slug": "nvidia-h200", "uuid": "GPU-1", "emulated": False, "gpu_index": 0}


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a document a value sits (its keys and indices), the root included."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, prefix + (i,))
    return out


def _replaced(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    copy = json.loads(json.dumps(doc))
    node = copy
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return copy


def mutants(doc: Any) -> st.SearchStrategy[Any]:
    """``doc`` with one of its nodes replaced by any JSON value (or a key of an object dropped)."""
    places = _paths(doc)

    def mutate(i: int, value: Any, drop: bool) -> Any:
        path = places[i % len(places)]
        if drop and path:
            copy = json.loads(json.dumps(doc))
            node = copy
            for step in path[:-1]:
                node = node[step]
            node.pop(path[-1])
            return copy
        return _replaced(doc, path, value)

    return st.builds(mutate, st.integers(min_value=0), JSON, st.booleans())


def _dump(doc: Any) -> str:
    return json.dumps(doc, allow_nan=True, ensure_ascii=True)  # a lone surrogate is written as \\ud800


def _results_doc(tmp: Path) -> dict[str, Any]:
    recs = [ResultRecord("bench.py::test_gemm[bf16]", Metric("bf16_tflops", 700.0 + i, "TFLOPS", "higher",
                                                             [699.0, 700.0, 701.0], "tensor"),
                         TargetInfo.from_dict(TARGET), {"driver": "580.159.04"}, f"2026-11-2{i}T00:00:00+00:00",
                         verdict=Verdict.from_dict({"outcome": "pass", "change_pct": 0.1, "confirmations": [700.0]}))
            for i in range(2)]
    path = tmp / "seed.json"
    write_results(path, recs, {"complete": True, "durations": {"bench.py::test_gemm[bf16]": 61.9},
                                "window": {"seconds": 300.0, "left": ["bench.py::test_openmm"]}})
    return json.loads(path.read_text())


def _run_cli(args: list[str]) -> int:
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        return cli.main(args)


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("seeds")
    ref_path = SHIPPED / "nvidia-h200" / "full.json"
    store = BaselineStore(tmp / "baselines")
    store.save(read_results_file(_write(tmp / "r.json", _results_doc(tmp)))[0])
    return {"results": _results_doc(tmp), "reference": json.loads(ref_path.read_text()),
            "baseline": json.loads(store.path_for("nvidia-h200", "full").read_text())}


def _write(path: Path, doc: Any) -> Path:
    path.write_text(_dump(doc))
    return path


def _mutant_file(factory: pytest.TempPathFactory, data: Any, seed: Any, where: str) -> Path:
    """A mutant of ``seed`` written at ``where`` in a fresh folder, as the reader will find it."""
    path = factory.mktemp("m") / where
    path.parent.mkdir(parents=True)
    return _write(path, data.draw(mutants(seed)))


@FUZZ
@given(data=st.data())
def test_results_files_read_or_say_why_and_the_commands_never_trace_back(seeds: dict[str, Any], tmp_path_factory:
                                                                         pytest.TempPathFactory, data: Any) -> None:
    tmp = tmp_path_factory.mktemp("r")
    doc = data.draw(mutants(seeds["results"]))
    path = _write(tmp / "night.json", doc)
    try:
        records, meta = read_results_file(path)
    except ResultsFileError as exc:
        assert str(exc).startswith(str(path)) and "\n" not in str(exc)
        return
    assert isinstance(meta, dict) and all(isinstance(r.metric.value, float) for r in records)
    seconds, _ = last_runs(tmp)  # --mig-window's reading of the folder, and node mode's merge of its meta
    assert all(math.isfinite(v) and v >= 0 for v in seconds.values())
    assert isinstance(merge_meta([meta]), dict)
    good = _write(tmp / "earlier.json", seeds["results"])
    assert _run_cli(["compare", str(good), str(path)]) in (0, 1, 2)
    assert _run_cli(["report", str(good), str(path)]) in (0, 1, 2)
    assert _run_cli(["samples", str(good), str(path)]) in (0, 2)
    assert _run_cli(["reference", str(path), "--out", str(tmp / "ref")]) in (0, 1, 2)
    assert _run_cli(["history", str(good), str(path), "--out", str(tmp / "trend.html")]) in (0, 2)
    collect(None, [path])


@FUZZ
@given(data=st.data())
def test_baseline_files_read_or_say_why(seeds: dict[str, Any], tmp_path_factory: pytest.TempPathFactory,
                                        data: Any) -> None:
    path = _mutant_file(tmp_path_factory, data, seeds["baseline"], "baselines/nvidia-h200/full.json")
    tmp = path.parent.parent.parent
    text = path.read_text()
    try:
        base = load_baseline_file(path)
    except BaselineError as exc:
        assert str(exc).startswith(str(path)) and "\n" not in str(exc)
        return
    for e in base.entries.values():  # what the verdict layer will do with it
        assert all(math.isfinite(v) and v > 0 for v in e.values) and e.direction in ("higher", "lower")
    rec = ResultRecord("bench.py::test_gemm[bf16]", Metric("bf16_tflops", 700.0, "TFLOPS", "higher", [], "tensor"),
                       TargetInfo.from_dict(TARGET), {"driver": "580.159.04"})
    try:
        BaselineStore(tmp / "baselines").save([rec])
    except BaselineError:
        assert path.read_text() == text  # a save that is refused leaves the file as it was


@FUZZ
@given(data=st.data())
def test_reference_files_read_or_say_why(seeds: dict[str, Any], tmp_path_factory: pytest.TempPathFactory,
                                         data: Any) -> None:
    path = _mutant_file(tmp_path_factory, data, seeds["reference"], "nvidia-h200/full.json")
    tmp = path.parent.parent
    try:
        ref = ReferenceStore(tmp).load("nvidia-h200", "full")
    except BaselineError as exc:
        assert str(exc).startswith(str(path)) and "\n" not in str(exc)
        return
    assert ref is not None
    for e in list(ref.baseline.entries.values())[:5]:
        ref.band_for(e)


#: Number literals no float holds, or past Python's int-to-string limit (4300 digits).
LITERALS = st.sampled_from(["1" * 31, "-" + "9" * 400, "1" * 5000, "1e999", "-1e999", "1" + "0" * 400 + ".5",
                            "1e-999", "-0", "-0.0", "4.9e-324", "2.5e-324", "1" * 30]).map(lambda n: f'{{"a": [{n}]}}')


@FUZZ
@given(text=st.text(max_size=40) | LITERALS | st.sampled_from(["[" * 100_000, '{"a": ' * 5000, "NaN", "-Infinity",
                                                                '{"a": 1, "a": 2}', "\ud800"]))
def test_any_text_parses_or_is_one_sentence(text: str) -> None:
    try:
        doc = parse_json(text, "f.json")
    except FileProblem as exc:
        assert str(exc).startswith("f.json: ") and "\n" not in str(exc)
        return
    assert doc is None or isinstance(doc, (dict, list, str, int, float, bool))
    for number in doc.get("a", []) if isinstance(doc, dict) else []:  # what the reader let through: a float
        assert math.isfinite(float(number)) and len(str(abs(int(number)))) <= 30


def test_nesting_deeper_than_any_file_is_refused_before_a_reader_recurses(tmp_path: Path) -> None:
    deep = "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5)
    with pytest.raises(FileProblem, match="nested more than 32 levels deep"):
        parse_json(deep, "f.json")
    path = tmp_path / "night.json"
    path.write_text('{"schema": "pytest-mig/results/1", "records": ' + "[" * 50_000 + "]" * 50_000 + "}")
    with pytest.raises(ResultsFileError, match="nested"):
        read_results_file(path)


#: Strings made of what a depth read from the text could mistake for structure.
TRICKY = st.text(st.sampled_from('[]{}"\\:,u05cn ') | st.characters(codec=None), max_size=10)
NESTED = st.recursive(st.none() | st.booleans() | st.floats(allow_nan=False) | TRICKY,
                      lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TRICKY, inner, max_size=4),
                      max_leaves=40)


@FUZZ
@given(doc=NESTED | st.integers(min_value=0, max_value=40).map(lambda n: [[]] * 2 if n < 2 else _deep(n)),
       indent=st.sampled_from([None, 0, 2]), ascii_only=st.booleans())
def test_the_depth_read_from_the_text_is_the_documents(doc: Any, indent: int | None, ascii_only: bool) -> None:
    text = json.dumps(doc, indent=indent, ensure_ascii=ascii_only)
    assert text_depth(text) == depth(json.loads(text))


def _deep(n: int) -> Any:
    """A list n levels deep, with a string of brackets at the bottom."""
    doc: Any = ['"[{"']
    for _ in range(n - 1):
        doc = [doc, {"k]": doc}] if n < 12 else [doc]
    return doc


PARSERS: list[tuple[Callable[[str], Any], tuple[type[BaseException], ...]]] = [
    (tolerance_arg, (argparse.ArgumentTypeError,)),
    (positive_int_arg, (argparse.ArgumentTypeError,)),
    (count_arg, (argparse.ArgumentTypeError,)),
    (factor_arg, (argparse.ArgumentTypeError,)),
    (runs_arg, (argparse.ArgumentTypeError,)),
    (parse_export, (ValueError,)),
    (SUCoefficients.from_string, (ValueError,)),
    (parse_profile, (ProfileError,)),
    (window_arg, (argparse.ArgumentTypeError,)),
]


@FUZZ
@given(text=st.text(max_size=30) | st.text(st.characters(codec=None), max_size=300)
       | st.sampled_from(["inf", "nan", "-inf", "1e308", "1.5e308", "5%%", "=1", "prometheus=", "github=",
                          "cpu=1e308", "0x10", "1_0", "9" * 5000, "1" * 400, "-" + "9" * 31, "1e-320", "-0.0",
                          "github=" + "a" * 300, "prometheus=a/\x00", "1g." + "9" * 100_000 + "gb", "\ud800" * 10,
                          "x" * 100_000, "5e-324", "1" + "0" * 400 + "%"]))
def test_every_option_parser_returns_or_says_why(text: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    for parse, errors in PARSERS:
        try:
            value = parse(text)
        except errors as exc:  # its own error type, which argparse and pytest turn into a usage error
            assert str(exc) and str(exc).isprintable(), f"{parse.__name__}: {str(exc)!r}"  # nothing drives a terminal
            assert len(str(exc)) < 600, f"{parse.__name__} echoed {len(str(exc))} characters"  # the value is cut
            continue
        if isinstance(value, float):
            assert math.isfinite(value), f"{parse.__name__}({text!r}) gave {value}"
        if isinstance(value, int):
            assert abs(value) <= 10**6, f"{parse.__name__}({text!r}) gave a count of {len(str(value))} digits"


@pytest.mark.parametrize("text", ["inf", "nan", "1e308", "-1", "100%", "1.5"])
def test_hostile_tolerances_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        tolerance_arg(text)


@pytest.mark.parametrize("text", ["nan", "inf", "1", "0.5"])
def test_hostile_outlier_factors_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        factor_arg(text)


def test_su_coefficients_that_would_make_figures_infinite_are_refused() -> None:
    with pytest.raises(ValueError, match=r"SU coefficient gpu must be a number from 0 to 1e\+06"):
        SUCoefficients.from_string("gpu=1e308")


def test_a_shipped_reference_survives_a_copy_round_trip(tmp_path: Path) -> None:
    """The fuzz's seed is a real shipped file, and it reads as shipped."""
    shutil.copytree(SHIPPED / "nvidia-h200", tmp_path / "nvidia-h200")
    assert ReferenceStore(tmp_path).load("nvidia-h200", "full") is not None


@FUZZ
@given(text=TEXTS | st.text(st.characters(codec=None), min_size=60, max_size=300))
def test_every_path_option_takes_the_path_or_says_why(text: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Any string as a path: the checks every path option and CLI path goes through say why in one
    short printable sentence, and a path they let through can be asked about without an OSError."""
    why = path_problem(text)
    try:
        check_path("--mig-results", text)
    except FileProblem as exc:
        assert why is not None and str(exc).isprintable() and len(str(exc)) < 1200  # 80 characters, escaped
        return
    assert why is None
    Path(text).exists()  # no ENAMETOOLONG, no embedded NUL
    try:
        path_arg(text)
    except argparse.ArgumentTypeError:
        raise AssertionError(f"{text!r}: passed check_path, refused by the CLI") from None


@FUZZ
@given(slug=TEXTS, profile=TEXTS)
def test_a_slug_and_profile_from_file_data_make_a_path_inside_the_store_or_are_refused(slug: str, profile: str,
                                                                                     tmp_path: Path) -> None:
    store = BaselineStore(tmp_path / "baselines")
    try:
        path = store.path_for(slug, profile)
    except BaselineError as exc:
        assert str(exc).isprintable() and len(str(exc)) < 400
        return
    assert path.parent.parent == store.root and path.parent.name == slug
    path.exists()  # no OSError
