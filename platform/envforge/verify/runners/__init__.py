"""Test runners envforge places in the grading sandbox (stdlib-only scripts)."""
