"""Adapters that plug the environment service into trainers teams already use:

- `trl_env`: an `environment_factory` for TRL's `GRPOTrainer`, TRL's documented agentic route (the five
  actions as tool methods on one session per episode, the verified reward as `get_reward`);
- `trl_grpo`: a `rollout_func` for TRL's `GRPOTrainer` (multi-turn episodes on the service, generated
  with the trainer's sampling settings in one batch per turn, the verified reward forwarded to a reward function);
- `openenv`: OpenEnv 0.3 (`openenv-core`) clients of the service's `/openenv` surface: a typed `EnvClient`
  (WebSocket), an `MCPToolClient` over HTTP MCP, and a session factory for `openenv.core.harness`;
- `verl_agent_loop` (+ `verl_agent_loop.yaml`): verl's `envforge_agent` loop, one session per
  trajectory, observations back to the model, verified at the end (data from
  `envforge rollout-export --format verl`); `verl_reward`: the reward functions reading its results.
- `verifiers_env`: a verifiers 0.4 environment (taskset + multi-turn env, reward from the service's
  verifier), loaded by `vf-eval envforge-verifiers` through the `envforge_verifiers` module.
"""
