"""Priors: a figure's run-to-run sigma known before its own history can measure it.

A site's history of 1 to 4 runs cannot measure its figures' noise; :func:`pytest_mig.judge.noise.band`
judges it with a prior instead (and, up to ``PRIOR_RUNS`` runs, never with less).  Where it comes
from, most specific first:

1. **The reference of the figure's GPU model and profile**: the figure's sigma across the
   reference's runs, pooled over the model's profiles and boards (the larger of its own and its
   timing partners', :meth:`pytest_mig.judge.reference.Reference.band_for`).  Where every run of
   the history was measured on the board being judged (a site's history of one board, the usual
   case), the sigma of each reference board's runs about their own median instead
   (:meth:`~pytest_mig.judge.reference.Reference.board_sigma_for`): the noise a history of one board
   sees from night to night, without the few percent that boards differ by, which such a history
   never has to hold.  A history that mixes boards (a baseline folder shared between nodes) keeps
   the sigma across boards.  An emulated profile's, either way, is never below the figure's spread
   across the profile's boards where they ran it once each
   (:meth:`~pytest_mig.judge.reference.Reference.spread_for`, ``PRIOR_SPREAD`` where it is the
   larger): nothing shows that profile's boards agree night to night.
2. **The same figure in the model's other profiles** (a profile with no reference of its own: a
   real MIG slice where the references hold emulated ones): the model's sigma, which is pooled over
   its profiles anyway.
3. **The same figure on the GPU models that have a reference** (a GPU model with no reference: an
   A100, an L40S, a B200): the largest of their sigmas.  The figure's noise comes mostly from the
   workload's own timing (launches, the host, the energy window), which a GPU model does not change
   much; the largest is the cautious side.  So too where the model's own reference holds the figure
   from fewer than ``MIN_PRIOR_DOF`` degrees of freedom (a figure added or redefined since its runs
   were taken), too few to show it quiet: the largest of the sigmas known from enough (the other
   models', and the model's own in the shipped references where a site's folder hid them), never
   below the thin one; with none, the thin prior stands, and the band ignores it.

A figure no reference holds (a site's own benchmark) has no prior: its first runs are judged with
the conservative band of :func:`~pytest_mig.judge.noise.band` until they can measure its noise, since
nothing known says how noisy a workload of the site's own is.  Nor has a CPU run's figure (a runner
with no GPU): a CPU's small-size timings move far more than a GPU's, so no GPU's sigma speaks for them.

The reference of the figure's own GPU model and profile also gives an energy figure's leakage slope
(:meth:`Priors.slope_for`, :mod:`pytest_mig.judge.thermal`), with which its history is brought to the
run's temperature.

A verdict judged with 2 or 3 says so, naming the models.  The shipped references are always
consulted for 2 and 3, also where a site replaced or switched off the reference its first nights
are judged against (``--mig-reference``): what they say about noise holds either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol

from pytest_mig.device.profiles import CPU
from pytest_mig.judge.noise import MIN_PRIOR_DOF, PRIOR, PRIOR_BOARD, PRIOR_ELSEWHERE, PRIOR_SPREAD, Prior
from pytest_mig.judge.reference import SHIPPED, Reference, ReferenceStore, pooled_dof
from pytest_mig.judge.thermal import Slope, slope_of
from pytest_mig.measure.metric import timing_partners
from pytest_mig.store.baselines import meta_from_record
from pytest_mig.store.history import BaselineEntry, BaselineError, BaselineMeta, board_of
from pytest_mig.store.results import ResultRecord

Figure = tuple[str, str, str]  # (test, metric, mode)


class PriorSource(Protocol):
    """Where a pipeline gets each figure's prior."""

    def for_record(self, rec: ResultRecord, history: BaselineEntry | None = None) -> Prior | None:
        """The prior of the record's figure, judged against ``history`` (None: none is known)."""

    def slope_for(self, rec: ResultRecord) -> Slope | None:
        """The leakage slope of the record's energy figure (None: none is known, or it is no energy figure)."""


class Priors:
    """The prior of each record's figure, from ``references`` (the site's reference folder, or None
    where it switched them off) and the shipped references."""

    def __init__(self, references: ReferenceStore | None, shipped: ReferenceStore | None = None) -> None:
        self.references = references
        self.shipped = shipped if shipped is not None else _shipped_like(references)
        self._figures: dict[tuple[ReferenceStore | None, ...], dict[Figure, dict[str, _Pooled]]] = {}

    def for_record(self, rec: ResultRecord, history: BaselineEntry | None = None) -> Prior | None:
        """The prior of the record's figure judged against ``history``, its runs so far (None: no
        reference knows the figure).  Where every run of ``history`` is of the record's board, the
        reference's noise on one board speaks for it."""
        board = board_of(rec.fingerprint) or rec.target.gpu_uuid
        one_board = history is not None and history.on_board(board)
        return self.for_figure(meta_from_record(rec), (rec.test, rec.metric.name, rec.mode), one_board,
                               rec.metric.kind)

    def slope_for(self, rec: ResultRecord) -> Slope | None:
        """The leakage slope of the record's energy figure, fitted within each board's runs of the
        reference of its GPU model and profile (the shipped one where a site's folder does not hold
        the figure, as its prior is; :func:`pytest_mig.judge.thermal.slope_of`): where significant,
        what brings its history to this run's temperature, and either way how steep a board may be.
        None for any other figure, a CPU run, or a figure that reference does not hold with
        temperatures enough to fit one."""
        meta = meta_from_record(rec)
        if rec.metric.kind != "energy" or meta.gpu_slug == CPU:
            return None
        key = (rec.test, rec.metric.name, rec.mode)
        entry = next((e for ref in (self._profile_reference(meta), _reference(self.shipped, meta))
                      if ref is not None and (e := ref.get(*key)) is not None), None)
        if entry is None:
            return None
        return slope_of({board: [(r.temperature_c, r.value) for r in runs]
                         for board, runs in entry.runs_by_board.items()})

    def for_figure(self, meta: BaselineMeta, key: Figure, one_board: bool = False,
                   kind: str | None = None) -> Prior | None:
        """The prior of figure ``key`` (test, metric, mode) on the GPU model and profile of ``meta``,
        for a history of one board's runs where ``one_board`` (None for a CPU run: the module
        docstring).  Where the profile's reference does not hold the figure, never below the prior
        its reference gives the rates that time the same work (``kind``: the figure's, to find them),
        as a figure it holds is judged."""
        if meta.gpu_slug == CPU:
            return None
        own = self._own(meta, key, one_board)
        prior = self._for_figure(meta, key, one_board, own)
        if own is not None or prior is None or not prior.judges_short:
            return prior
        floor = self._partners(meta, key, one_board, kind)
        if floor is None or floor[0] <= prior.sigma:
            return prior
        return Prior(floor[0], f"{prior.source}; no less than that of {floor[1]}, which times the same work "
                               f"(this profile's reference)", prior.dof)

    def _partners(self, meta: BaselineMeta, key: Figure, one_board: bool,
                  kind: str | None) -> tuple[float, str] | None:
        """The largest prior, and whose, of the rate figures that time the same work as ``key``
        (:func:`~pytest_mig.measure.metric.timing_partners`) in the reference of its own profile."""
        test, metric, mode = key
        ref = self._profile_reference(meta)
        if ref is None or kind is None:
            return None
        figures = {e.metric: e.kind for e in ref.baseline.entries.values() if e.test == test and e.mode == mode}
        known = [(p.sigma, name) for name in timing_partners(metric, kind, figures.items())
                 for p in [self._own(meta, (test, name, mode), one_board)] if p is not None and p.judges_short]
        return max(known) if known else None

    def _for_figure(self, meta: BaselineMeta, key: Figure, one_board: bool, own: Prior | None) -> Prior | None:
        """The prior of ``key`` given ``own``, its profile's reference's (:meth:`_own`)."""
        if own is not None and own.judges_short:
            return own
        others = {m: p.on(one_board) for m, p in self._table().get(key, {}).items()}
        where = "night to night on one board" if one_board else "across nights and boards"
        model = meta.gpu_model
        if own is not None:
            return self._thin(own, meta, key, one_board, others, where)
        if model in others:  # held from too few runs (a redefined figure), as its own profile's would be
            sigma, dof = others[model]
            mine = Prior(sigma, f"{PRIOR_ELSEWHERE}the noise {where} of {model}'s "
                                f"other profiles; no reference run of it for this profile", dof)
            return mine if mine.judges_short else self._thin(mine, meta, key, one_board, others, where)
        if others:
            name = max(others, key=lambda m: others[m][0])
            sigma, dof = others[name]
            whose = name if len(others) == 1 else f"{_names(others)}, the largest ({name})"
            return Prior(sigma, f"{PRIOR_ELSEWHERE}the noise {where} of {whose}; no reference run of it for this GPU model",
                         dof)
        return None

    def _thin(self, own: Prior, meta: BaselineMeta, key: Figure, one_board: bool,
              others: dict[str, tuple[float, int]], where: str) -> Prior:
        """The prior of a figure its model's reference holds from too few runs to say how noisy it is
        (a figure added or redefined since its runs were taken): the largest of the sigmas known well
        enough, the model's own in the shipped references (where a site's folder hid them) and the
        other models', but never below the thin one (two runs far apart are evidence of noise too).
        With none known well enough, the thin prior itself (the band then ignores it)."""
        model = meta.gpu_model
        known = {m: sd for m, sd in others.items() if m != model and sd[1] >= MIN_PRIOR_DOF}
        if self.references is not None and self.shipped is not None:
            pooled = self._table((self.shipped,)).get(key, {}).get(model)
            shipped = pooled.on(one_board) if pooled is not None else None
            if shipped is not None and shipped[1] >= MIN_PRIOR_DOF:
                known[f"{model}'s shipped reference"] = shipped
        if not known:
            return own
        name = max(known, key=lambda m: known[m][0])
        sigma, dof = known[name]
        whose = name if len(known) == 1 else f"{_names(known)}, the largest ({name})"
        thin = f"{own.dof} degree{'' if own.dof == 1 else 's'} of freedom"
        if own.sigma > sigma:
            return Prior(own.sigma, f"{PRIOR_ELSEWHERE}this GPU model's reference, from too few runs ({thin}), "
                                    f"larger than the noise {where} of {whose}", dof)
        return Prior(sigma, f"{PRIOR_ELSEWHERE}the noise {where} of {whose}; this GPU model's reference "
                            f"holds too few runs of the figure ({thin})", dof)

    def _own(self, meta: BaselineMeta, key: Figure, one_board: bool) -> Prior | None:
        """The prior from the reference of the figure's own GPU model and profile."""
        ref = self._profile_reference(meta)
        entry = ref.get(*key) if ref is not None else None
        if ref is None or entry is None:
            return None
        pooled = self._table().get(key, {}).get(meta.gpu_model)
        spread = ref.spread_for(entry) or 0.0
        board = ref.board_sigma_for(entry) if one_board else None
        if board is not None and board >= spread:
            return Prior(board, PRIOR_BOARD, pooled.board_dof if pooled is not None else None)
        sigma = ref.band_for(entry).sigma
        if sigma is None and board is None:
            return None
        wider = max(sigma or 0.0, board or 0.0)
        return Prior(max(wider, spread), PRIOR if wider >= spread else PRIOR_SPREAD,
                     pooled.dof if pooled is not None else None)

    def _profile_reference(self, meta: BaselineMeta) -> Reference | None:
        """The reference of ``meta``'s GPU model and profile: the site's folder where it gave one (it
        speaks for its GPU models: the shipped one is not asked), else the shipped one."""
        return _reference(self.references if self.references is not None else self.shipped, meta)

    def _table(self, stores: tuple[ReferenceStore | None, ...] | None = None) -> dict[Figure, dict[str, _Pooled]]:
        """Every figure's sigmas in the references of ``stores`` (the site's and the shipped ones where
        None), by GPU model, with the degrees of freedom they were pooled from (each of the model's
        files adds its runs of the figure less one; on one board, each board's runs less one)."""
        stores = stores if stores is not None else (self.references, self.shipped)
        if stores not in self._figures:
            table: dict[Figure, dict[str, _Pooled]] = {}
            for ref in _all(*stores):
                model = ref.baseline.meta.gpu_model
                for entry in ref.baseline.entries.values():
                    sigma = ref.band_for(entry).sigma
                    if sigma is None:
                        continue
                    by_model = table.setdefault((entry.test, entry.metric, entry.mode), {})
                    held = by_model.setdefault(model, _Pooled(sigma, 0, ref.board_sigma_for(entry), 0))
                    held.dof += max(len(entry.runs) - 1, 0)  # the sigmas are pooled over the model's files alike
                    held.board_dof += pooled_dof(entry.values_by_board.values())
            self._figures[stores] = table
        return self._figures[stores]


@dataclass
class _Pooled:
    """A figure's sigmas in one GPU model's references: across boards, and on one board (None: no
    reference run names its board)."""

    sigma: float
    dof: int
    board_sigma: float | None
    board_dof: int

    def on(self, one_board: bool) -> tuple[float, int]:
        """The sigma for a history of one board's runs (where known) or else, and its dof."""
        if one_board and self.board_sigma is not None:
            return self.board_sigma, self.board_dof
        return self.sigma, self.dof


def reference_prior(references: ReferenceStore | None, rec: ResultRecord) -> float | None:
    """The figure's sigma in the reference of its GPU model and profile (the larger of its own and
    its timing partners'); None where the reference does not know the figure's noise."""
    return _reference_sigma(references, meta_from_record(rec), (rec.test, rec.metric.name, rec.mode))


def _reference_sigma(references: ReferenceStore | None, meta: BaselineMeta, key: Figure) -> float | None:
    """Figure ``key``'s sigma in the reference of ``meta``'s GPU model and profile."""
    ref = _reference(references, meta)
    entry = ref.get(*key) if ref is not None else None
    return ref.band_for(entry).sigma if ref is not None and entry is not None else None


def _reference(references: ReferenceStore | None, meta: BaselineMeta) -> Reference | None:
    """The reference of ``meta``'s GPU model and profile.  One that cannot be read gives none: the
    site's own history still judges."""
    if references is None:
        return None
    try:
        return references.load(meta.gpu_slug, meta.profile)
    except BaselineError:
        return None


def _shipped_like(references: ReferenceStore | None) -> ReferenceStore | None:
    """The shipped references, unless ``references`` is that folder already."""
    if references is not None and references.root.resolve() == SHIPPED.resolve():
        return None
    return ReferenceStore(SHIPPED)


def _all(*stores: ReferenceStore | None) -> Iterable[Reference]:
    """Every readable reference of the stores, a GPU model's from the first store that holds it: a
    site's folder made from a copy of the shipped one would otherwise count its runs twice, and a
    figure held from too few runs would pass for one known well enough."""
    seen: set[str] = set()
    for store in stores:
        if store is None:
            continue
        refs = store.references(skip_broken=True)
        yield from (ref for ref in refs if ref.baseline.meta.gpu_model not in seen)
        seen |= {ref.baseline.meta.gpu_model for ref in refs}


def _names(models: dict[str, float]) -> str:
    names = sorted(models)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


__all__ = ["PriorSource", "Priors", "reference_prior"]
