"""Scale-out: a sandbox fleet over many Docker hosts, on Ray (the optional `fleet` extra).

- `config.FleetConfig`: the settings (ENVFORGE_RAY_ADDRESS, ENVFORGE_FLEET_*), typed.
- `node.NodeAgent`: one per node (a detached Ray actor), owning its engine, images and warm pool.
- `dispatcher.FleetDispatcher`: places sandboxes on nodes by image locality, room and warmth,
  with backpressure; node loss becomes `InfraError('node_lost')`.
- `distribution.ImageDistribution`: which node has which image, and getting one onto a node
  that lacks it (build from its recipe, or transfer from a node or the driver's engine).
- `pool.FleetSandboxPool` / `RemoteSandbox`: the sandbox-pool interface over the fleet, so the
  rollout scheduler, the grader and the gate run on it unchanged.
- `images`: the per-engine steps of distribution without a registry (a recipe's build, docker
  save/load of the bytes that travel through Ray's object store).
- `raycalls`: Ray imported late, and what its exceptions say about a node.
- `provider.FleetSandboxProvider`: the fleet as a sandbox provider (`envforge.sandbox.provider`),
  a fleet pool per unit of work told its work ahead; `dispatcher_from_env`, the process's dispatcher.
- `local.LocalCluster`: a head and worker nodes on one machine (demo, tests, benchmark).

Nothing here is imported by the single-machine path (`envforge.runtime.sandbox_provider` imports
`provider` only when ENVFORGE_RAY_ADDRESS is set); Ray is imported only when a fleet starts. The
fleet builds on the sandbox and verify layers and imports nothing above them: the stages get it as
a provider handed down, never by name. The fleet demo is `envforge.demos.fleet`. See docs/fleet.md.
"""
