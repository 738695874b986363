"""The verifiers environment package of envforge: `vf-eval envforge-verifiers` imports this module (verifiers
finds an environment by module name and reads its `Taskset` and `Env` from `__all__`). The classes live in
`envforge_client.adapters.verifiers_env`; install with `pip install 'envforge-client[verifiers]'`."""

from envforge_client.adapters.verifiers_env import EnvforgeEnv, EnvforgeTaskset

__all__ = ["EnvforgeEnv", "EnvforgeTaskset"]
