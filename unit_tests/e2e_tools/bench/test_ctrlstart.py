"""The real controller process against e2e/bench/ctrlstart.py's loopback stand-in, at toy size: it
lists in pages, explains the unsatisfiable claims through its write budget, leaves the fitting one
alone, and the bench reads what it must."""

from __future__ import annotations

from e2e.bench.ctrlstart import run, synced


def test_a_small_start_and_backlog() -> None:
    got = run(nodes=30, claims=700, pods=1200, backlog=40, settle=0.5, timeout=120)
    assert got["backlog_explained"] == 40 and not got["fitting_claim_written"]
    assert got["writes"] >= 41  # the unsatisfiable claim, its 40 copies, and what Events the budget let through
    assert set(got["listed_s"]) == {"resourceslices", "deviceclasses", "resourceclaimtemplates", "resourceclaims", "pods",
                                    "nodes", "devicetaintrules"}
    assert 0 < got["start_to_all_listed_s"] <= got["start_to_first_explanation_s"]
    assert 20 < got["rss_settled_mib"] <= got["rss_peak_mib"]


def test_synced_memory() -> None:
    got = synced(nodes=30, claims=500, pods=900, settle=0.5, timeout=120)
    assert got["start_to_all_listed_s"] > 0 and 20 < got["rss_synced_mib"] <= got["rss_peak_mib"]
