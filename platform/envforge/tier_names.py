"""The names a task set's members are labelled with: difficulty tiers and splits.

Below both the catalog schema (`schemas`, which checks a member's tier and split) and
`rollout.tiers` (which assigns them), so the schema imports no domain package and reading the
tier names does not load pandera.
"""

TIERS = ("unsolved", "hard", "medium", "easy", "trivial")
SPLITS = ("train", "eval", "audit")  # audit: unsolved tasks and weak verifiers, kept for review, never trained on
