"""The largest batch remembered per stack: confirmed with the search's own guarantee, never trusted blindly."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_mig.workloads import batch_search as bs
from pytest_mig.workloads import training as tr
from pytest_mig.workloads.caches import Caches


def _oom_above(threshold: int, calls: list[int]):
    def try_batch(b: int) -> None:
        calls.append(b)
        if b > threshold:
            raise bs.OOM_ERROR("CUDA out of memory")
    return try_batch


def test_batches_are_kept_per_case_and_an_unreadable_file_is_no_answer(stack: Path) -> None:
    caches = Caches(stack=stack)
    assert bs.recall("gpt2|full", caches) == {}  # nothing yet: the search runs
    bs.remember("gpt2|full", caches=caches, eager=48, compiled=126)
    bs.remember("qwen|full", caches=caches, eager=18, compiled=None)
    assert bs.recall("gpt2|full", caches) == {"eager": 48, "compiled": 126}
    assert bs.recall("qwen|full", caches) == {"eager": 18}
    bs.remember("gpt2|full", caches=caches, eager=50)  # a new eager batch keeps the compiled one
    assert bs.recall("gpt2|full", caches) == {"eager": 50, "compiled": 126}
    for text in ('{"gpt2|full": {"eager": 48, "eager": 1}}', '{"gpt2|full": {"eager": true}}', "[1]", "{"):
        (stack / bs.FILE).write_text(text)
        assert bs.recall("gpt2|full", caches) == {}  # never an error: the search runs
    bs.remember("gpt2|full", caches=caches, eager=48)  # and an unreadable cache is rebuilt
    assert bs.recall("gpt2|full", caches) == {"eager": 48}


def test_nothing_is_kept_without_a_stack_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    for caches in (None, Caches(), Caches(built_systems=tmp_path / "built", references=tmp_path / "refs")):
        bs.remember("gpt2|full", caches=caches, eager=48)
        assert bs.recall("gpt2|full", caches) == {} and not list(tmp_path.iterdir())


def test_a_remembered_batch_is_confirmed_with_two_probes_or_searched_again() -> None:
    calls: list[int] = []
    found = bs.confirm_batch(_oom_above(50, calls), 48, limit=256, resolution=0.125)
    assert found is not None and (found.batch, found.remembered, found.capped) == (48, True, False)
    assert calls == [48, 54] and found.tried == [(48, True), (54, False)]  # it fits; one resolution step more does not
    calls.clear()
    assert bs.confirm_batch(_oom_above(60, calls), 48, limit=256, resolution=0.125) is None  # more fits now: search
    assert bs.confirm_batch(_oom_above(40, calls), 48, limit=256, resolution=0.125) is None  # no longer fits: search
    calls.clear()
    capped = bs.confirm_batch(_oom_above(1000, calls), 64, limit=64, resolution=0.125)
    assert capped is not None and capped.capped and calls == [64]  # at the limit nothing above is tried
    assert bs.confirm_batch(_oom_above(1000, calls), 65, limit=64, resolution=0.125) is None  # the limit fell: search


@settings(max_examples=200, deadline=None)
@given(threshold=st.integers(1, 300), resolution=st.sampled_from([0.0, 0.0625, 0.125, 0.25]),
       limit=st.integers(1, 256), start=st.integers(1, 64))
def test_a_confirmed_batch_is_what_the_search_finds(threshold: int, resolution: float, limit: int, start: int) -> None:
    calls: list[int] = []
    try:
        searched = tr.max_batch_search(_oom_above(threshold, calls), start=start, limit=limit, resolution=resolution)
    except tr.DoesNotFit:
        return
    confirmed = bs.confirm_batch(_oom_above(threshold, calls), searched.batch, limit=limit, resolution=resolution)
    # the search's answer is confirmed where its guarantee (the next resolution step fails) holds, and
    # whatever is confirmed is within the search's resolution of the true largest batch
    if confirmed is not None:
        true_max = min(threshold, limit)
        assert confirmed.batch <= true_max <= confirmed.batch + max(1, int(confirmed.batch * resolution))
    else:
        gap = max(1, int(searched.batch * resolution))
        assert searched.batch + gap <= min(threshold, limit)  # refused only where more fits than one step above


def test_a_remembered_compiled_batch_is_tried_once() -> None:
    calls: list[int] = []
    grown = bs.confirm_growth(_oom_above(130, calls), 48, 126)
    assert grown is not None and (grown.start, grown.batch, grown.remembered, calls) == (48, 126, True, [126])
    assert grown.to_dict()["per_sequence_gb"] is None  # not measured tonight: the record does not pretend it was
    assert bs.confirm_growth(_oom_above(100, calls), 48, 126) is None
    assert bs.confirm_growth(_oom_above(1000, calls), 48, 40) is None  # below its own start: not a growth


class _Trainer:
    """A training run's batch probes: eager steps fit up to ``eager``, compiled steps up to ``compiled``."""

    def __init__(self, eager: int, compiled: int) -> None:
        self.cfg, self.mode, self.device = SimpleNamespace(name="gpt2-small", fixed_batch=8), "full", "cuda:0"
        self.eager, self.compiled, self.is_compiled, self.probes = eager, compiled, False, []

    def probe(self, b: int, room: float | None = None, *, steps: int = 1) -> None:
        self.probes.append((b, self.is_compiled))
        if b > (self.compiled if self.is_compiled else self.eager):
            raise bs.OOM_ERROR("CUDA out of memory")

    def compile(self) -> None:
        self.is_compiled = True

    def uncompile(self) -> None:
        self.is_compiled = False

    def after_oom(self) -> None:
        pass


def _grow_to_projection(trainer: _Trainer, start: int, room: float, limit: int) -> tr.BatchGrowth:
    # the projection a compiled step's memory gives (the real one reads torch.cuda's counters)
    return bs.grow_batch(lambda b: trainer.probe(b), start=start, resting_bytes=0.0, peak_bytes=float(start),
                         room_bytes=2.0 * start / bs.COMPILED_MARGIN, limit=limit, after_oom=trainer.after_oom)


TARGET = SimpleNamespace(gpu_slug="nvidia-h100-80gb-hbm3", baseline_profile="full", effective_sms=132, is_cpu=False,
                         memory_budget=lambda: 80 * 10**9)
EFFORT = tr.Effort(warmup=1, repeats=3, max_batch=256, search_resolution=0.125)


def test_the_second_night_confirms_what_the_first_found(stack: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    caches = Caches(stack=stack)
    monkeypatch.setattr(tr, "_grow_compiled", _grow_to_projection)
    first = _Trainer(eager=50, compiled=200)
    search, growth = tr._find_batch(first, TARGET, EFFORT, compile_model=True, caches=caches)
    assert (search.batch, growth.batch, search.remembered, growth.remembered) == (48, 96, False, False)
    second = _Trainer(eager=50, compiled=200)
    search, growth = tr._find_batch(second, TARGET, EFFORT, compile_model=True, caches=caches)
    assert (search.batch, growth.batch, search.remembered, growth.remembered) == (48, 96, True, True)
    assert second.probes == [(1, False), (96, True)]  # the optimizer state's probe, then one compiled probe
    eager = _Trainer(eager=50, compiled=200)
    assert tr._find_batch(eager, TARGET, EFFORT, compile_model=False, caches=caches)[0].batch == 48
    eager = _Trainer(eager=50, compiled=200)
    search, growth = tr._find_batch(eager, TARGET, EFFORT, compile_model=False, caches=caches)
    assert (search.batch, search.remembered, growth, eager.probes) == (48, True, None, [(1, False), (48, False), (54, False)])


def test_a_night_with_less_memory_does_not_shrink_the_next(stack: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    caches = Caches(stack=stack)
    monkeypatch.setattr(tr, "_grow_compiled", _grow_to_projection)
    tr._find_batch(_Trainer(eager=50, compiled=200), TARGET, EFFORT, compile_model=True, caches=caches)
    crowded = _Trainer(eager=50, compiled=60)  # another process holds memory: the compiled batch no longer fits
    search, growth = tr._find_batch(crowded, TARGET, EFFORT, compile_model=True, caches=caches)
    assert (96, True) in crowded.probes and (search.remembered, growth.remembered) == (True, False)
    assert growth.batch == 48  # the projection (96) and halfway (72) ran out of memory: the eager batch
    # the fallback is not remembered: the projection did not fit, so the next night tries it again
    case = bs.key("gpt2-small", "full", True, "max 256, resolution 0.125", TARGET)
    assert bs.recall(case, caches) == {"eager": 48, "compiled": 96}
    free = _Trainer(eager=50, compiled=200)
    search, growth = tr._find_batch(free, TARGET, EFFORT, compile_model=True, caches=caches)
    assert (growth.batch, growth.remembered) == (96, True)


def test_a_first_night_compiled_case_confirms_the_eager_cases_batch(stack: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    caches = Caches(stack=stack)
    monkeypatch.setattr(tr, "_grow_compiled", _grow_to_projection)
    eager = _Trainer(eager=50, compiled=200)
    assert tr._find_batch(eager, TARGET, EFFORT, compile_model=False, caches=caches)[0].batch == 48  # the eager case, searched
    assert len(eager.probes) > 4
    compiled = _Trainer(eager=50, compiled=200)
    search, growth = tr._find_batch(compiled, TARGET, EFFORT, compile_model=True, caches=caches)
    # its eager search is the eager case's batch, confirmed with two probes; the growth still runs
    assert (search.batch, search.remembered, growth.batch, growth.remembered) == (48, True, 96, False)
    assert compiled.probes[:3] == [(1, False), (48, False), (54, False)]
    # where the eager case's batch no longer holds (less memory tonight), the search runs as before
    (stack / bs.FILE).unlink()
    bs.remember(bs.key("gpt2-small", "full", False, "max 256, resolution 0.125", TARGET), caches=caches, eager=48)
    crowded = _Trainer(eager=30, compiled=200)
    search = tr._find_batch(crowded, TARGET, EFFORT, compile_model=True, caches=caches)[0]
    assert (48, False) in crowded.probes and not search.remembered and search.batch <= 30


VERSIONS = {"torch": "2.11.0", "transformers": "5.17.0"}
CASE = bs.key("gpt2-small", "full", True, "max 256, resolution 0.125", TARGET)


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    """This stack's folder in ``.mig-compile-cache/`` (other stacks' folders beside it); the references
    in ``tmp_path / "refs"`` (:func:`_caches`)."""
    return tmp_path / ".mig-compile-cache" / "b7f8eb5d4f"


def _caches(cache: Path) -> Caches:
    """The caches of a run whose stack's folder is ``cache`` and whose references are in ``refs`` beside
    the cache folder."""
    return Caches(stack=cache, references=cache.parent.parent / "refs")


def _write(path: Path, doc: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return path


def test_a_seed_is_a_compiled_batch_found_under_the_same_versions(cache: Path) -> None:
    caches = _caches(cache)
    assert bs.seed(CASE, VERSIONS, caches) is None  # nothing anywhere
    old = _write(cache.parent / "0a1b2c3d4e" / bs.FILE, {CASE: {"eager": 48, "compiled": 126, **VERSIONS}})
    assert bs.seed(CASE, VERSIONS, caches) == (126, "stack 0a1b2c3d4e")  # the stack before a driver update
    assert bs.seed(CASE, {**VERSIONS, "torch": "2.12.0"}, caches) is None  # a compiled step's memory is torch's
    assert bs.seed(CASE, {}, caches) is None
    assert bs.seed(bs.key("qwen1.5b", "full", True, "max 256, resolution 0.125", TARGET), VERSIONS, caches) is None
    _write(old, {CASE: {"eager": 48, "compiled": 126}})  # remembered before versions were kept: no seed
    assert bs.seed(CASE, VERSIONS, caches) is None
    _write(cache / bs.FILE, {CASE: {"compiled": 130, **VERSIONS}})  # this stack's own file is recall's, not a seed
    assert bs.seed(CASE, VERSIONS, caches) is None
    _write(cache.parent.parent / "refs" / bs.SEEDS, {CASE: {"compiled": 120, **VERSIONS}})
    assert bs.seed(CASE, VERSIONS, caches) == (120, "reference")
    _write(cache.parent / "9f8e7d6c5b" / bs.FILE, {CASE: {"compiled": 124, **VERSIONS}})
    assert bs.seed(CASE, VERSIONS, caches) == (124, "stack 9f8e7d6c5b")  # a site's own stacks before the references


@pytest.mark.parametrize("bad", ["{not json", "[]", json.dumps({CASE: {"compiled": True, **VERSIONS}}),
                                 json.dumps({CASE: {"compiled": -3, **VERSIONS}}), json.dumps({CASE: "126"}),
                                 json.dumps({CASE: {"compiled": 126.0, **VERSIONS}})])
def test_a_seed_file_that_holds_no_valid_batch_is_passed_over(cache: Path, bad: str) -> None:
    caches = _caches(cache)
    _write(cache.parent / "0a1b2c3d4e" / bs.FILE, bad)
    _write(cache.parent.parent / "refs" / bs.SEEDS, {CASE: {"compiled": 120, **VERSIONS}})
    assert bs.seed(CASE, VERSIONS, caches) == (120, "reference")  # never an error: the next place is read


def test_a_seeded_first_night_compiles_once_and_a_wrong_seed_costs_the_growth(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    caches = _caches(cache)
    monkeypatch.setattr(tr, "_grow_compiled", _grow_to_projection)
    monkeypatch.setattr(tr, "_batch_versions", lambda: dict(VERSIONS))
    _write(cache.parent / "0a1b2c3d4e" / bs.FILE, {CASE: {"eager": 48, "compiled": 96, **VERSIONS}})
    assert tr._find_batch(_Trainer(eager=50, compiled=200), TARGET, EFFORT, compile_model=False, caches=caches)[0].batch == 48
    first = _Trainer(eager=50, compiled=200)
    search, growth = tr._find_batch(first, TARGET, EFFORT, compile_model=True, caches=caches)
    assert (search.batch, growth.batch, growth.remembered, growth.seeded_from) == (48, 96, True, "stack 0a1b2c3d4e")
    assert first.probes == [(1, False), (96, True)]  # no eager confirmation, one compiled size: one compilation
    assert growth.to_dict()["seeded_from"] == "stack 0a1b2c3d4e"
    assert json.loads((cache / bs.FILE).read_text())[CASE] == {"eager": 48, "compiled": 96, **VERSIONS}  # now its own
    (cache / bs.FILE).unlink()
    bs.remember(bs.key("gpt2-small", "full", False, "max 256, resolution 0.125", TARGET), caches=caches, eager=48)
    small = _Trainer(eager=50, compiled=80)  # the seed does not fit here: grown as on any first night
    search, growth = tr._find_batch(small, TARGET, EFFORT, compile_model=True, caches=caches)
    assert (96, True) in small.probes and not growth.seeded_from and growth.batch == 72  # halfway to the projection
    assert bs.recall(CASE, caches) == {"eager": 48}  # the projection did not fit: no compiled batch is kept


def test_the_shipped_seeds_are_compiled_batches_of_models_and_gpus_the_suite_knows() -> None:
    from pytest_mig.judge.reference import SHIPPED
    from pytest_mig.workloads.hf import CONFIGS

    doc = json.loads((SHIPPED / bs.SEEDS).read_text())
    assert doc, "the references ship compiled-batch seeds"
    for case, entry in doc.items():
        config, mode, compiled, search, slug, profile, sms, memory = case.split("|")
        assert config in CONFIGS and compiled == "compiled" and (SHIPPED / slug / f"{profile}.json").is_file()
        assert search.startswith("max ") and int(sms) > 0 and int(memory) > 0
        assert isinstance(entry["compiled"], int) and entry["compiled"] >= entry.get("eager", 1) > 0
        assert entry["torch"] and entry["transformers"]  # a seed is used only under the same versions
