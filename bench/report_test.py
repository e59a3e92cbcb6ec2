#!/usr/bin/env python3
"""Tests of bench/report.py (and bench/run's row()): verdicts and counts, baselines
that could not run, quick rows, and the stale flag, on small hand-made results and a
throwaway git repository. Standard library and git only:

    python3 bench/report_test.py
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import report  # noqa: E402


def load_bench_run():
    """bench/run as a module (it has no .py suffix); importing it runs nothing."""
    loader = importlib.machinery.SourceFileLoader("bench_run", str(BENCH / "run"))
    spec = importlib.util.spec_from_loader("bench_run", loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_run"] = module  # for its dataclasses
    loader.exec_module(module)
    return module


def r(case, troupe=10.0, baseline_value=5.0, target="", met=None, **extra):
    ratio = None if baseline_value is None else round(troupe / baseline_value, 3)
    return {"case": case, "unit": "GB/s", "better": "higher", "troupe": troupe, "baseline": "memcpy",
            "baseline_value": baseline_value, "ratio": ratio, "target": target, "met": met,
            "machine": "test box", "date": "2026-01-01 00:00 UTC", **extra}


ROWS = [
    r("met row", target=">= 1x", met=True),
    r("missed row", troupe=4.0, target=">= 1x", met=False),
    r("missing row", baseline_value=None, target=">= 1x PyTorch", baseline_missing=True),
    # written before bench/run marked missing baselines: a target, no value, no verdict
    r("old missing row", baseline_value=None, target=">= 2x gloo"),
    # an absolute target needs no baseline: judged, and not "baseline missing"
    r("bound row", baseline_value=None, target="<= 10 ms", met=True),
    # a target shown for information is never counted, baseline or not
    r("information row", baseline_value=None, target=">= 1x (for information)", baseline_missing=True,
      for_information=True),
    r("quick row", target=">= 1x", met=True, quick=True),
    r("no target row"),
]


def line(markdown: str, case: str) -> str:
    return next(text for text in markdown.splitlines() if text.startswith(f"| {case} |"))


class Verdicts(unittest.TestCase):
    def test_counts_take_a_missing_baseline_as_not_met(self):
        self.assertEqual(report.counts(ROWS), (3, 6))
        self.assertEqual([x["case"] for x in ROWS if report.baseline_missing(x)],
                         ["missing row", "old missing row", "information row"])

    def test_table_shows_the_missing_baseline_and_quick_rows(self):
        md = report.render({"alpha": ROWS})
        self.assertTrue(line(md, "met row").endswith("| 2.000 | >= 1x | yes |"))
        self.assertTrue(line(md, "missed row").endswith("| 0.800 | >= 1x | **no** |"))
        self.assertTrue(line(md, "missing row").endswith("| — | baseline missing | >= 1x PyTorch | **no** |"))
        self.assertTrue(line(md, "old missing row").endswith("| baseline missing | >= 2x gloo | **no** |"))
        self.assertTrue(line(md, "bound row").endswith("| — | <= 10 ms | yes |"))
        self.assertTrue(line(md, "information row").endswith("| baseline missing | >= 1x (for information) |  |"))
        self.assertIn("| quick row | 10.0 GB/s (quick) |", md)
        self.assertIn("| met row | 10.0 GB/s |", md)
        self.assertTrue(line(md, "no target row").endswith("| 2.000 |  |  |"))

    def test_summaries_count_the_same(self):
        md = report.render({"alpha": ROWS, "beta": [r("beta met", target=">= 1x", met=True)]})
        self.assertIn("8 cases; 3 of 6 targets met. Missed: `missed row`, `missing row` (baseline missing), "
                      "`old missing row` (baseline missing).", md)
        self.assertIn("1 rows, marked (quick), are timed in a single short round.", md)
        self.assertIn("**4 of 7 targets met** across the areas:", md)
        self.assertIn("| [alpha](#alpha) | 3 of 6 | 2026-01-01 00:00 UTC | quick rows |", md)
        self.assertIn("| [beta](#beta) | 1 of 1 | 2026-01-01 00:00 UTC |  |", md)

    def test_an_all_quick_area_says_so(self):
        md = report.render({"alpha": [r("a", target=">= 1x", met=True, quick=True)]})
        self.assertIn("All rows come from a `--quick` run", md)

    def test_a_case_against_several_baselines_names_the_one_missed(self):
        rows = [r("save", target=">= 1x", met=True), {**r("save", target=">= 1x", met=False), "baseline": "h5py"}]
        self.assertIn("Missed: `save` vs h5py.", report.summary(rows))


class BenchRunRow(unittest.TestCase):
    """bench/run's row(): a target with no baseline value and no verdict is a missing
    baseline; a bound needs no baseline."""

    @classmethod
    def setUpClass(cls):
        cls.bench = load_bench_run()

    def test_a_target_without_its_baseline_is_marked_missing(self):
        got = self.bench.row("c", "s", "lower", 1.0, "PyTorch: skipped", None, ">= 1x PyTorch")
        self.assertTrue(got["baseline_missing"])
        self.assertIsNone(got["met"])

    def test_a_verdict_computed_without_the_baseline_is_dropped(self):
        got = self.bench.row("c", "s", "lower", 1.0, "torchrun: missing", None, "<= 2 s", True, baseline_missing=True)
        self.assertIsNone(got["met"])
        self.assertEqual(report.counts([got]), (0, 1))

    def test_a_bound_is_not_a_missing_baseline(self):
        got = self.bench.row("c", "s", "lower", 1.0, "none", None, "<= 2 s", True)
        self.assertNotIn("baseline_missing", got)
        self.assertEqual(report.counts([got]), (1, 1))

    def test_information_targets_are_not_counted(self):
        got = self.bench.row("c", "samples/s", "higher", 1.0, "PyTorch", 2.0, ">= 1x", for_information=True)
        self.assertEqual(report.counts([got]), (0, 0))


class Stale(unittest.TestCase):
    PATHS = {"alpha": ["src/"]}

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = Path(self.tmp.name)
        self.git("init", "-q")
        self.write("src/a.c", "int a;\n")
        self.write("docs/readme", "hello\n")
        self.commit("first")

    def tearDown(self):
        self.tmp.cleanup()

    def git(self, *args):
        return subprocess.run(["git", "-C", str(self.root), "-c", "user.name=t", "-c", "user.email=t@t",
                               "-c", "commit.gpgsign=false", *args],
                              check=True, capture_output=True, text=True).stdout.strip()

    def write(self, path, text):
        (self.root / path).parent.mkdir(parents=True, exist_ok=True)
        (self.root / path).write_text(text)

    def commit(self, message):
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message)
        return self.git("rev-parse", "HEAD")

    def rows(self, **stamp):
        return [r("x", target=">= 1x", met=True, **stamp)]

    def flag(self, rows):
        return report.freshness(self.root, "alpha", rows, self.PATHS)

    def test_current_results_are_not_flagged(self):
        rows = self.rows(**report.provenance(self.root, "alpha", self.PATHS))
        self.write("docs/readme", "changed\n")
        self.commit("docs only")
        self.assertIsNone(self.flag(rows))

    def test_a_source_changed_since_flags_the_area(self):
        measured = self.git("rev-parse", "HEAD")
        rows = self.rows(commit=measured, dirty=False)
        self.write("src/a.c", "int a = 1;\n")
        changed = self.commit("change a source")
        self.assertEqual(self.flag(rows),
                         f"**Stale:** measured at {measured[:7]}; `src/` changed since, last in {changed[:7]}.")
        md = report.render({"alpha": rows}, self.root, self.PATHS)
        self.assertIn("## alpha\n\n**Stale:** measured at", md)
        self.assertIn("| [alpha](#alpha) | 1 of 1 | 2026-01-01 00:00 UTC | stale |", md)
        self.assertIn(f"Commit: {measured[:7]}.", md)

    def test_a_change_that_left_the_machine_code_as_it_was_is_current(self):
        measured = self.git("rev-parse", "HEAD")
        rows = self.rows(commit=measured, dirty=False)
        self.write("src/a.c", "int a; /* a comment */\n")
        same = self.commit("same code")
        with mock.patch.dict(report.SAME_CODE, {same: "a comment"}):
            self.assertIsNone(self.flag(rows))
            self.write("src/a.c", "int a = 5;\n")
            changed = self.commit("new code in the same file")
            self.assertEqual(self.flag(rows),
                             f"**Stale:** measured at {measured[:7]}; `src/` changed since, last in {changed[:7]}.")
        self.assertIn("changed since", self.flag(rows))

    def test_measuring_uncommitted_changes_then_committing_them_is_current(self):
        self.write("src/a.c", "int a = 2;\n")
        self.write("src/new.c", "int b;\n")
        stamp = report.provenance(self.root, "alpha", self.PATHS)
        self.assertTrue(stamp["dirty"])
        self.assertEqual(sorted(stamp["dirty_sources"]), ["src/a.c", "src/new.c"])
        self.commit("the measured change")
        self.assertIsNone(self.flag(self.rows(**stamp)))

    def test_measuring_changes_that_were_never_committed_is_stale(self):
        self.write("src/a.c", "int a = 3;\n")
        stamp = report.provenance(self.root, "alpha", self.PATHS)
        self.git("checkout", "--", "src/a.c")
        self.assertIn("uncommitted changes to `src/a.c` that HEAD does not have", self.flag(self.rows(**stamp)))

    def test_an_unknown_commit_is_flagged(self):
        self.assertEqual(self.flag(self.rows()), "**Measured at an unknown commit.**")

    def test_an_unknown_commit_is_bounded_by_the_commit_of_its_results(self):
        self.write("bench/results/alpha.json", '[{"date": "2026-01-01 00:00 UTC"}]\n')
        bound = self.commit("results")
        self.assertIn(f"unknown commit, no later than {bound[:7]}", self.flag(self.rows()))
        self.assertIn("its sources have not changed since", self.flag(self.rows()))
        self.write("src/a.c", "int a = 4;\n")
        changed = self.commit("change a source")
        self.assertEqual(self.flag(self.rows()),
                         f"**Stale:** measured at an unknown commit, no later than {bound[:7]} (which committed "
                         f"these results); `src/` changed since, last in {changed[:7]}.")

    def test_a_commit_the_repository_lacks(self):
        self.assertIn("a commit this repository does not have", self.flag(self.rows(commit="0" * 40)))

    def test_no_git_no_flag(self):
        with tempfile.TemporaryDirectory() as plain:
            self.assertIsNone(report.freshness(Path(plain), "alpha", self.rows(commit="0" * 40), self.PATHS))
            self.assertEqual(report.provenance(Path(plain), "alpha", self.PATHS), {})
        with mock.patch.dict(os.environ, {"PATH": ""}):
            self.assertIsNone(self.flag(self.rows(commit="0" * 40)))
            self.assertEqual(report.provenance(self.root, "alpha", self.PATHS), {})


if __name__ == "__main__":
    unittest.main()
