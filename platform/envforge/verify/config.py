"""The flakiness gate's settings: one typed config for the CLI, the Dagster run config and MLflow params.

Kept apart from the gate so reading it (the CLI builds its options from it) imports nothing heavy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

BELOW_STRENGTH = ("quarantine", "audit")
WEAK_FAIL_TO_PASS = ("shape", "any", "report")
ORDER_CHECKS = ("files", "suite")
MUTANT_TESTS = ("covering", "files")


def _default_runs() -> int:
    # The one setting read outside envforge.settings (which declares it, with this default; a test
    # holds them equal): the CLI builds its options from a GateConfig() at start-up, where importing
    # the settings model (pydantic-settings) would slow every `envforge --help`.
    return int(os.environ.get("ENVFORGE_GATE_RUNS", "5"))


@dataclass
class GateConfig:
    """Gate parameters. `as_params()` (what decides a verdict) is part of a task-set version and of a
    verdict's key; `workers`, `concurrency` and `force` change only how long gating takes."""

    runs: int = field(
        default_factory=_default_runs,
        metadata={
            "help": "gradings of the empty and of the reference solution, each "
            "(default: $ENVFORGE_GATE_RUNS or 5; the order check is one of the "
            "reference's, or one more with full_suite)"
        },
    )
    shuffle: bool = field(
        default=True,
        metadata={"help": "the order check: one of the reference's runs, in reversed order (see order_check)"},
    )
    order_check: str = field(
        default="files",
        metadata={
            "help": "what the order check runs: 'files', the test files that decide the verdict (what every grading "
            "runs, so every pair of their tests is seen in both orders), or 'suite', the whole suite, which also "
            "quarantines a test that fails only after another file's tests ran (a dependence no grading meets; the "
            "full-suite gate always runs the suite)"
        },
    )
    probes: bool = field(default=True, metadata={"help": "run the reward-hacking probes that apply to each task"})
    full_suite: bool = field(
        default=False,
        metadata={
            "help": "the exhaustive gate: the whole suite on every grading, every run and probe graded even after a "
            "disagreement, no shared copies"
        },
    )
    workers: int = field(
        default=2, metadata={"help": "gradings of one task in parallel (verdicts do not depend on it)"}
    )
    concurrency: int = field(default=2, metadata={"help": "tasks gated at once (one warm sandbox pool)"})
    mutation: bool = field(
        default=True,
        metadata={
            "help": "verifier strength: grade mutants of each test-verified task's reference (and the special-case "
            "probe) and keep tasks whose tests reject too few of them out of train and eval (one grading per "
            "mutant, paid once per task: unchanged tasks keep their verdict; see docs/verification.md)"
        },
    )
    min_strength: float = field(
        default=0.5,
        metadata={"help": "the lowest strength (killed / non-equivalent mutants) a task's verifier may have"},
    )
    max_mutants: int = field(default=24, metadata={"help": "mutants graded per task at most"})
    below_strength: str = field(
        default="quarantine",
        metadata={
            "help": "what happens to a weak or overfittable verifier: 'quarantine' (as weak_verifier / overfittable) "
            "or 'audit' (accepted into the audit split only, never train or eval)"
        },
    )
    block_overfittable: bool = field(
        default=False,
        metadata={
            "help": "treat a task the special-case probe passes as a weak verifier (by default it is flagged "
            "'overfittable' only: its tests are held back from the policy, which cannot read their literals)"
        },
    )
    weak_fail_to_pass: str = field(
        default="shape",
        metadata={
            "help": "a task whose FAIL_TO_PASS tests pass the weak-form probe's wrong value while a PASS_TO_PASS test "
            "refuses it: 'shape' (a weak verifier when they assert only a length, a type, membership or `is not "
            "None` of the result; a predicate asserted truthy is not one), 'any' (truthiness too), 'report' "
            "(flagged only); a verifier the whole of which takes the wrong value is weak in every case"
        },
    )
    mutation_early_stop: bool = field(
        default=True,
        metadata={
            "help": "stop grading a task's mutants once its strength is on one side of min_strength for sure (the "
            "score is then a lower bound)"
        },
    )
    mutant_timeout_min_s: float = field(
        default=15.0,
        metadata={
            "help": "the least time a mutant's tests may run before it counts as hanging (killed); the limit is 4x "
            "the slowest reference/empty grading when that is more. A mutant that hangs is killed either way: "
            "this only bounds what it costs"
        },
    )
    mutant_fail_fast: bool = field(
        default=True,
        metadata={
            "help": "grade each mutant's FAIL_TO_PASS tests first and stop at the first that fails (its verdict, "
            "killed, is then decided; off: every mutant's tests run in full, as before)"
        },
    )
    mutant_tests: str = field(
        default="covering",
        metadata={
            "help": "which tests grade a mutant: 'covering', the FAIL_TO_PASS tests and the PASS_TO_PASS tests "
            "that call the function it changes (one traced grading of the reference says which; a mutant no test "
            "calls survives ungraded), or 'files', every test of the verdict's files"
        },
    )
    force: bool = field(
        default=False,
        metadata={
            "help": "re-gate tasks whose content, image and gate parameters are unchanged (by default they keep "
            "their verdict)"
        },
    )

    def __post_init__(self) -> None:
        for name in ("runs", "workers", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"GateConfig.{name}: must be at least 1, got {getattr(self, name)}")
        if self.max_mutants < 1:
            raise ValueError(f"GateConfig.max_mutants: must be at least 1, got {self.max_mutants}")
        if not self.mutant_timeout_min_s > 0:
            raise ValueError(f"GateConfig.mutant_timeout_min_s: must be positive, got {self.mutant_timeout_min_s}")
        if not 0.0 <= self.min_strength <= 1.0:
            raise ValueError(f"GateConfig.min_strength: must be between 0 and 1, got {self.min_strength}")
        if self.weak_fail_to_pass not in WEAK_FAIL_TO_PASS:
            raise ValueError(
                f"GateConfig.weak_fail_to_pass: must be one of {', '.join(WEAK_FAIL_TO_PASS)}, "
                f"got {self.weak_fail_to_pass!r}"
            )
        if self.order_check not in ORDER_CHECKS:
            raise ValueError(
                f"GateConfig.order_check: must be one of {', '.join(ORDER_CHECKS)}, got {self.order_check!r}"
            )
        if self.mutant_tests not in MUTANT_TESTS:
            raise ValueError(
                f"GateConfig.mutant_tests: must be one of {', '.join(MUTANT_TESTS)}, got {self.mutant_tests!r}"
            )
        if self.below_strength not in BELOW_STRENGTH:
            raise ValueError(
                f"GateConfig.below_strength: must be one of {', '.join(BELOW_STRENGTH)}, got {self.below_strength!r}"
            )

    def as_params(self) -> dict:
        """What a verdict depends on (recorded with it, and in the task-set version)."""
        params = {
            "gate": "flakiness",
            "runs": self.runs,
            "shuffle": self.shuffle,
            "probes": self.probes,
            "full_suite": self.full_suite,
        }
        if self.shuffle and not self.full_suite:
            params["order_check"] = self.order_check
        if self.mutation:  # absent when off, so verdicts gated without it keep their keys
            params.update(
                mutation=True,
                min_strength=self.min_strength,
                max_mutants=self.max_mutants,
                below_strength=self.below_strength,
                mutation_early_stop=self.mutation_early_stop,
                block_overfittable=self.block_overfittable,
                weak_fail_to_pass=self.weak_fail_to_pass,
                # a mutant slower than the limit but right would count as killed: the limit is part of the verdict
                mutant_timeout_min_s=self.mutant_timeout_min_s,
            )
            if not self.mutant_fail_fast:  # absent when on (the default), so verdicts keep their keys
                params["mutant_fail_fast"] = False
            if self.mutant_tests != "covering":
                params["mutant_tests"] = self.mutant_tests
        return params
