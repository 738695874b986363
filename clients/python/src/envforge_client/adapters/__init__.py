"""Adapters that plug the environment service into trainers teams already use:

- `trl_grpo`: a `rollout_func` for TRL's `GRPOTrainer` (multi-turn episodes on the service, the
  verified reward forwarded to a reward function);
- `openenv`: OpenEnv 0.3 (`openenv-core`) clients of the service's `/openenv` surface: a typed `EnvClient`
  (WebSocket), an `MCPToolClient` over HTTP MCP, and a session factory for `openenv.core.harness`;
- `verl_reward`: verl's `compute_score` grading a response on the service (data from
  `envforge rollout-export --format verl`).
"""
