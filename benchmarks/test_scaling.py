"""Scaling against ideal: every metric measured on two or more profiles of one GPU model.

The plugin runs this test after all other benchmarks (marker ``mig_scaling``) and hands it this
run's records plus those of ``--mig-scaling-results`` files; stored baselines of the same GPU model
fill in profiles neither measured.  It skips, saying what it saw, when no metric has two profiles
(a single-slice run), and fails with the ratio / ideal / deviation table when a ratio is off by
more than its kind's tolerance (pytest_mig.judge.scaling.SCALING_TOLERANCE).
"""

from __future__ import annotations

import pytest

from pytest_mig.store.baselines import BaselineStore
from pytest_mig.plugin import add_summary_section, baseline_dir
from pytest_mig.store.results import ResultRecord
from pytest_mig.judge.scaling import check_scaling


@pytest.mark.mig_scaling
def test_scaling_against_ideal(mig_run_results: list[ResultRecord], request: pytest.FixtureRequest) -> None:
    basis = request.config.getoption("mig_scaling_basis", default="slices") or "slices"
    slugs = {str(r.target.gpu_slug) for r in mig_run_results if r.target.gpu_slug}
    store = BaselineStore(baseline_dir(request.config))  # the option, else the ini, from the rootdir
    stored: list[ResultRecord] = []
    for slug in sorted(slugs):
        records, problems = store.records(slug)
        stored.extend(records)
        for line in problems:  # a broken file is reported by the verdicts; here it is only left out
            request.node.add_report_section("call", "mig scaling", f"not used: {line}")

    report = check_scaling(mig_run_results, basis=basis, extra=stored)
    table = report.format_table()
    request.node.user_properties.append(("mig_scaling_table", table))
    request.node.add_report_section("call", "mig scaling", table)
    if not report.rows:
        pytest.skip(report.skip_reason())
    add_summary_section(request.config, "pytest-mig scaling against ideal", table)
    plot = request.config.getoption("mig_scaling_plot", default=None)
    if plot:
        from pytest_mig.report.tables import plot_scaling

        add_summary_section(request.config, "pytest-mig scaling plot", str(plot_scaling(report, plot)))
    if report.failures:
        pytest.fail(report.failure_text(), pytrace=False)
