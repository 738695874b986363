"""Verification: run a task's checkpoints in a sandbox and turn them into a reward with reasons."""
