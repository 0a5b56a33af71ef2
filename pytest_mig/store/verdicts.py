"""The Verdict record: what the judge says of one figure, as its result record carries it and a
results file keeps it.

The rule that fills it and the words of its message are the judge's (:mod:`pytest_mig.judge.verdict`);
this layer only holds, writes and reads it, so that a result record is typed from the plugin to the
file and back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, Mapping, cast

Outcome = Literal["pass", "regressed", "improved", "noisy", "transient", "no-baseline", "incomparable", "info"]
OUTCOMES: tuple[str, ...] = ("pass", "regressed", "improved", "noisy", "transient", "no-baseline", "incomparable",
                             "info")

#: Rounding a threshold may carry past the limit it equals (``1 - 0.85`` is 0.15000000000000002).
LIMIT_SLACK = 1e-12
#: The outcomes of a figure a band was put on (:attr:`Verdict.judged`).
JUDGED: tuple[str, ...] = ("pass", "regressed", "improved", "transient", "noisy")


@dataclass(frozen=True)
class ClockNote:
    """What a figure's clock-normalised partner (``bf16_flop_per_sm_cycle``) did while the figure moved."""

    metric: str  # the per-cycle figure
    change_pct: float  # its signed change against its own history
    moved_too: bool  # it moved at least half as much: the kernel is slower per cycle, not only the clock


#: Fields the message is rendered from that a results file does not keep (the message holds their words).
_NOT_FILED = ("clock", "history_fingerprint", "history_throttled")
#: The fields a results file's verdict object gives, by class (found once).
_FILED: dict[type, frozenset[str]] = {}


@dataclass
class Verdict:
    """The outcome for one metric of one test, and the sentence that explains it."""

    outcome: Outcome
    metric: str
    value: float | None
    baseline: float | None  # the median of the runs kept
    change_pct: float | None  # signed change of the value in percent (-8.9 = 8.9% lower)
    tolerance: float | None  # the tolerance the threshold was held to (fraction)
    threshold: float | None = None  # relative change beyond which the figure is called changed
    sigma: float | None = None  # relative run-to-run sigma of the history (None: too few runs)
    detectable: float | None = None  # the smallest sustained change caught in >= 95% of runs
    runs: int | None = None  # runs in the baseline's history
    gates: bool | None = None  # False: too noisy to gate
    confirmations: list[float] = field(default_factory=list)  # re-measured values, when re-measured
    fingerprint_changes: list[str] = field(default_factory=list)
    throttled: list[str] = field(default_factory=list)
    message: str = ""
    unit: str = ""
    test: str = ""
    failed: bool = False  # does this verdict fail the test?
    direction: str = "higher"
    basis: str | None = None  # where the threshold came from: noise, floor, few-runs, tolerance, reference
    source: str | None = "baseline"  # against the site's own history ("baseline") or a shipped "reference"; None:
    # read from a results file that did not say
    sigma_of: str | None = None  # the rate figure that times the same work, where its sigma was the larger
    clock: ClockNote | None = None  # what its clock-normalised partner did (a throughput figure beyond its threshold)
    history_fingerprint: dict[str, Any] = field(default_factory=dict)  # the newest run's of the history judged against
    history_throttled: list[str] = field(default_factory=list)  # throttle reasons seen in that history's runs
    at_temperature: str | None = None  # an energy figure's history brought to this run's temperature: how
    warmth: str | None = None  # an energy figure read far from its runs' temperatures: how its band widened

    def to_dict(self) -> dict[str, Any]:
        """The ``verdict`` object of a results file."""
        d = asdict(self)
        for name in _NOT_FILED:
            del d[name]
        if d["source"] is None:  # read from a file that did not say: written back as it was
            del d["source"]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Verdict":
        """A results file's ``verdict`` object, its types checked already by the file's schema
        (:data:`pytest_mig.store.schemas.VERDICT`); fields it does not know are not read."""
        known = _FILED.get(cls)
        if known is None:
            known = _FILED[cls] = frozenset(f.name for f in fields(cls)) - set(_NOT_FILED)
        given = {k: list(v) if isinstance(v, list) else v for k, v in d.items() if k in known and v is not None}
        head = {"outcome": cast(Outcome, str(d["outcome"])), "metric": str(d.get("metric") or ""),
                "source": d.get("source")}
        return cls(**{"value": None, "baseline": None, "change_pct": None, "tolerance": None, **given, **head})

    @property
    def judged(self) -> bool:
        """Whether a band was put on the figure: judged against a history, a reference or a ceiling
        (``noisy`` too: judged too noisy to gate), not ``no-baseline``, ``incomparable`` or ``info``."""
        return self.outcome in JUDGED

    def gates_within(self, limit: float) -> bool:
        """Whether the figure gates with a threshold no wider than ``limit`` (a fraction): a change
        of that size tonight would be called one.  A threshold computed as ``1 - 0.85`` is within 15%."""
        return (bool(self.gates) and self.outcome != "noisy" and self.threshold is not None
                and self.threshold <= limit + LIMIT_SLACK)

    def catches(self, limit: float) -> bool:
        """Whether a lasting change of ``limit`` would be caught in 95% of runs: the figure gates within
        it, its noise is known, and the smallest change it detects is no larger."""
        return (self.gates_within(limit) and self.sigma is not None and self.detectable is not None
                and self.detectable <= limit + LIMIT_SLACK)

    def line(self) -> str:
        """The message with its outcome in front, as a failing test shows it."""
        label = "TOO NOISY TO GATE" if self.outcome == "noisy" else self.outcome.upper()
        return f"{label} {self.test + ' ' if self.test else ''}{self.message}".rstrip()


__all__ = ["JUDGED", "LIMIT_SLACK", "OUTCOMES", "ClockNote", "Outcome", "Verdict"]
