"""Policies behind one interface (`envforge.rollout.policies.base.Policy`)."""
