"""What a reference folder's verdicts are worth: each run of it judged against the others.

A reference's first-night verdict is a claim: an unchanged GPU of the model passes, one that lost
15% fails.  :func:`leave_one_out` tests both on the runs the folder holds.  Each run of each figure,
on every profile that holds two or more of them, is taken out in turn; the rest of the folder is the
reference it is judged against, its sigma recomputed as a build computes it (without that run).  The
run is an unchanged GPU of the model, usually another board than the rest, so a figure it fails is a
**false alarm**.  The same run made worse by a loss (``--loss``, 15% by default: its rate times 0.85, its
time or energy divided by it) and not failed is a **miss**.  Figures the band does not judge (too noisy,
or their noise unknown) count as neither: they are reported, not judged, on a first night too.

``pytest-mig reference-check DIR`` prints the counts per GPU model and mode, and each false alarm;
docs/nightly.md has the shipped folder's.  ``rule`` is the build's (:func:`pooled`) unless an experiment
gives another: docs/nightly.md tells of one that gave an outlying profile its own sigma and raised
false alarms this check found.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pytest_mig.store.baselines import BaselineStore
from pytest_mig.store.history import Baseline, BaselineEntry, EntryKey, Run
from pytest_mig.store.reader import load_baseline_file
from pytest_mig.judge.noise import reference_band
from pytest_mig.judge.reference import pooled_sigma
from pytest_mig.judge.verdict import worse_by

#: A rule that gives each group (profile) of a figure's runs its sigma.
SigmaRule = Callable[[Sequence[Sequence[float]]], list[float | None]]
#: A loss a first night must catch (the issue's "a GPU 15% under the reference").
LOSS = 0.15


def pooled(groups: Sequence[Sequence[float]]) -> list[float | None]:
    """The build's rule (:func:`pytest_mig.judge.reference.build`): every profile gets the sigma pooled over
    all of the model's profiles, so a figure noisy on one is not judged on any."""
    return [pooled_sigma(groups)] * len(groups)


@dataclass
class Tally:
    """Held-out runs of one GPU model and mode: how many, how many judged, false alarms, losses caught."""

    model: str
    mode: str
    cases: int = 0
    judged: int = 0
    false_alarms: list[str] = field(default_factory=list)
    caught: int = 0

    @property
    def missed(self) -> int:
        return self.judged - self.caught


def _lost(value: float, direction: str, loss: float) -> float:
    """``value`` after the GPU lost ``loss`` of its speed: a rate times (1 - loss), a time or energy over it."""
    return value * (1.0 - loss) if direction == "higher" else value / (1.0 - loss)


def _held_out(entry: BaselineEntry, run: Run, index: int) -> int | None:
    """Which of ``entry``'s runs is the held-out ``run`` (the ``index``-th of its own figure): a figure of
    the same test saved with it holds it at the same place, else at the one place recorded at its time
    (None: nowhere, so nothing of ``entry`` is taken out)."""
    if index < len(entry.runs) and entry.runs[index].recorded_at == run.recorded_at:
        return index
    at = [i for i, r in enumerate(entry.runs) if r.recorded_at == run.recorded_at]
    return at[0] if len(at) == 1 else None


def _values(entry: BaselineEntry, drop: int | None) -> list[float]:
    """The runs at the size the figure is judged at, less run ``drop`` (as the shipped sigma pools them)."""
    size = entry.size
    return [r.value for i, r in enumerate(entry.runs) if i != drop and (size is None or r.size == size)]


def _sigma(groups: dict[int, BaselineEntry], n: int, drop: int | None, rule: SigmaRule) -> float | None:
    """Profile ``n``'s sigma of a figure whose run ``drop`` is taken out of profile ``n``."""
    order = sorted(groups)
    values = [_values(groups[i], drop if i == n else None) for i in order]
    return rule(values)[order.index(n)]


def leave_one_out(bases: Sequence[Baseline], *, rule: SigmaRule = pooled, loss: float = LOSS) -> list[Tally]:
    """Every run of ``bases`` (one GPU model's profiles) judged against the others; per mode."""
    by_key: dict[EntryKey, dict[int, BaselineEntry]] = {}
    for n, base in enumerate(bases):
        for key, entry in base.entries.items():
            by_key.setdefault(key, {})[n] = entry
    model = bases[0].meta.gpu_model if bases else ""
    tallies: dict[str, Tally] = {}
    for (test, metric, mode), groups in sorted(by_key.items()):
        for n, entry in sorted(groups.items()):
            if len(entry.runs) < 2:
                continue
            partners = bases[n].timing_partners(entry)
            size = entry.size
            for i, run in enumerate(entry.runs):
                if size is not None and run.size != size:
                    continue  # measured at another size than the figure is judged at: another workload
                t = tallies.setdefault(mode, Tally(model, mode))
                t.cases += 1
                sigma = _sigma(groups, n, i, rule)
                ps = {p.metric: _sigma(by_key[(p.test, p.metric, p.mode)], n, _held_out(p, run, i), rule)
                      for p in partners}
                band = reference_band(_values(entry, i), sigma, ps)
                if not band.gates:
                    continue
                t.judged += 1
                worse = worse_by(run.value, band.center, entry.direction)
                if worse > band.threshold:
                    t.false_alarms.append(f"{bases[n].meta.profile} {test} {metric} {run.recorded_at}: "
                                          f"{worse:+.1%} worse, threshold {band.threshold:.1%}")
                if worse_by(_lost(run.value, entry.direction, loss), band.center, entry.direction) > band.threshold:
                    t.caught += 1
    return [tallies[m] for m in sorted(tallies, key=lambda m: m != "quick")]


def check_folder(root: Path, *, loss: float = LOSS, rule: SigmaRule = pooled) -> list[Tally]:
    """:func:`leave_one_out` of every GPU model in a reference folder."""
    models: dict[str, list[Baseline]] = {}
    for path in BaselineStore(root).files():
        models.setdefault(path.parent.name, []).append(load_baseline_file(path))
    return [t for _slug, bases in sorted(models.items()) for t in leave_one_out(bases, rule=rule, loss=loss)]


def check_lines(tallies: Sequence[Tally], loss: float) -> list[str]:
    """What ``pytest-mig reference-check`` prints: a line per GPU model and mode, then each false alarm."""
    lines = [f"each run of the reference judged against the others (profiles holding two or more runs of a "
             f"figure), then again after a loss of {loss:.0%}:",
             f"{'GPU model':24s} {'mode':7s} {'runs':>6s} {'judged':>7s} {'false alarms':>13s} {'loss caught':>12s}"]
    for t in tallies:
        caught = f"{t.caught}/{t.judged}" if t.judged else "-"
        lines.append(f"{t.model:24s} {t.mode:7s} {t.cases:6d} {t.judged:7d} {len(t.false_alarms):13d} {caught:>12s}")
    lines += [f"false alarm: {a}" for t in tallies for a in t.false_alarms]
    return lines


def summary(tallies: Sequence[Tally], loss: float = LOSS) -> str:
    """One sentence of the check, as ``pytest-mig reference`` prints it after a build."""
    judged = sum(t.judged for t in tallies)
    if not judged:
        return ("checked (pytest-mig reference-check): with any one run taken out, no figure has runs enough left "
                "to be judged (three of a profile, or two and a repeat on another)")
    alarms = sum(len(t.false_alarms) for t in tallies)
    found = "no false alarm" if not alarms else f"{alarms} false alarm(s) (pytest-mig reference-check names them)"
    return (f"checked (pytest-mig reference-check): each run judged against the others, {found} in {judged} judged "
            f"figures; a {loss:.0%} loss fails {sum(t.caught for t in tallies)} of them")


__all__ = ["LOSS", "SigmaRule", "Tally", "check_folder", "check_lines", "leave_one_out", "pooled", "summary"]
