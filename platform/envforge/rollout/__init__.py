"""Rollouts: a multi-turn environment over the sandbox, policies, a fault-tolerant async
scheduler, the trajectory store and difficulty tiers."""
