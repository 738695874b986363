"""Adapters that plug the environment service into trainers teams already use:

- `trl_grpo`: a `rollout_func` for TRL's `GRPOTrainer` (multi-turn episodes on the service, the
  verified reward forwarded to a reward function);
- `openenv`: the OpenEnv protocol (`openenv-core`'s `EnvClient`) served by envforge, and a typed client;
- `verl_reward`: verl's `compute_score` grading a response on the service (data from
  `envforge rollout-export --format verl`).
- `verifiers_env`: a verifiers 0.4 environment (taskset + multi-turn env, reward from the service's
  verifier), loaded by `vf-eval envforge-verifiers` through the `envforge_verifiers` module.
"""
