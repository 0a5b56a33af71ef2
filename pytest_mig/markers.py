"""What the plugin's markers say about a test: the Target it runs on, why it is skipped there, its key
in the histories, and the modules it imports."""

from __future__ import annotations

import math
import re

import pytest

from pytest_mig.device.profiles import ProfileError, parse_profile
from pytest_mig.device.plan import Plan
from pytest_mig.device.target import Target


def item_target(item: pytest.Item, plan: Plan) -> Target:
    """The Target an item runs on: its profile's under a sweep, else the run's."""
    callspec = getattr(item, "callspec", None)
    index = callspec.params.get("mig_device", 0) if callspec is not None else 0
    return plan.targets[index] if isinstance(index, int) and 0 <= index < len(plan.targets) else plan.targets[0]


def marker_number(item: pytest.Item, name: str, unit: str, example: str) -> float | None:
    """The one positive number a mig_min_* marker carries; a malformed marker is a usage error."""
    m = item.get_closest_marker(name)
    if m is None:
        return None
    values = list(m.args) + list(m.kwargs.values())
    try:
        if len(values) != 1 or isinstance(values[0], bool) or not math.isfinite(float(values[0])) \
                or float(values[0]) <= 0:
            raise ValueError
        return float(values[0])
    except (TypeError, ValueError):
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{name} needs one positive number of {unit}, e.g. "
                                f"@pytest.mark.{name}({example}); got {m.args or m.kwargs or '()'}.") from None


def known_profile(name: str) -> bool:
    """A name a profile marker can hold: 'full', 'cpu' or one that parses as a MIG profile (emulated or not)."""
    name = name.removesuffix("-emulated")
    if name in ("full", "cpu"):
        return True
    try:
        parse_profile(name)
    except ProfileError:
        return False
    return True


def skip_reason(item: pytest.Item, t: Target) -> str | None:
    need_gib = marker_number(item, "mig_min_memory", "GiB", "20")
    need_sms = marker_number(item, "mig_min_sms", "SMs", "32")
    m = item.get_closest_marker("mig_profiles")
    if m and (not m.args or m.kwargs or not all(isinstance(p, str) and known_profile(p) for p in m.args)):
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.mig_profiles needs the names of the profiles the test "
                                f"runs on, e.g. @pytest.mark.mig_profiles('1g.10gb', 'full'); got "
                                f"{m.args or m.kwargs or '()'}.")
    if m and t.profile not in m.args and t.baseline_profile not in m.args:
        return f"runs only on profiles {', '.join(map(str, m.args))}; this is {t.profile}"
    m = item.get_closest_marker("mig_gpu_only")
    if m and t.is_cpu:
        return "needs a GPU; this run is on the CPU"
    if need_gib is not None and not t.is_cpu and (t.memory_bytes or 0) < need_gib * 2**30:
        return f"needs {need_gib:g} GiB; {t.profile} has {(t.memory_bytes or 0) / 2**30:.1f} GiB"
    profile_sms = t.sms or t.effective_sms  # the profile's SMs, not what a green context rounded them to
    if need_sms is not None and not t.is_cpu and (profile_sms or 0) < need_sms:
        return f"needs {need_sms:g} SMs; {t.profile} has {profile_sms}"
    return None


def history_key(item: pytest.Item, target: Target, sweep: bool) -> str:
    """The node id without the profile parameter, so one test has one key across profiles."""
    key = item.nodeid
    if sweep:
        p = re.escape(target.profile)
        key = re.sub(rf"\[{p}\]$", "", key)
        key = re.sub(rf"(?<=[\[-]){p}-|-{p}(?=\])", "", key)
    return key


def marked_imports(items: list[pytest.Item]) -> list[str]:
    """The modules the run's tests name in ``mig_imports`` markers, in test order."""
    names: list[str] = []
    for item in items:
        for m in item.iter_markers("mig_imports"):
            if m.kwargs or not all(isinstance(a, str) and a for a in m.args):
                raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.mig_imports needs module names, e.g. "
                                        f"@pytest.mark.mig_imports('transformers.modeling_utils'); got "
                                        f"{m.args or m.kwargs or '()'}.")
            names.extend(a for a in m.args if a not in names)
    return names
