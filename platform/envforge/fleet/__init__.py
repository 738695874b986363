"""Scale-out: a sandbox fleet over many Docker hosts, on Ray (the optional `fleet` extra).

- `config.FleetConfig`: the settings (ENVFORGE_RAY_ADDRESS, ENVFORGE_FLEET_*), typed.
- `node.NodeAgent`: one per node (a detached Ray actor), owning its engine, images and warm pool.
- `dispatcher.FleetDispatcher`: places sandboxes on nodes by image locality, room and warmth,
  with backpressure; node loss becomes `InfraError('node_lost')`.
- `pool.FleetSandboxPool` / `RemoteSandbox`: the sandbox-pool interface over the fleet, so the
  rollout scheduler, the grader and the gate run on it unchanged.
- `provider.FleetSandboxProvider`: the fleet as a sandbox provider (`envforge.sandbox.provider`),
  a fleet pool per unit of work told its work ahead; `dispatcher_from_env`, the process's dispatcher.
- `images`: image distribution without a registry (build from the recipe, or docker save/load
  through Ray's object store).
- `local.LocalCluster`: a head and worker nodes on one machine (demo, tests, benchmark).

Nothing here is imported by the single-machine path (`envforge.runtime.sandbox_provider` imports
`provider` only when ENVFORGE_RAY_ADDRESS is set); Ray is imported only when a fleet starts. The
fleet builds on the sandbox and verify layers and imports nothing above them: the stages get it as
a provider handed down, never by name. The fleet demo is `envforge.demos.fleet`. See docs/fleet.md.
"""
