"""The real Codex CLI as an agent backend (``--agent codex-cli``).

- ``install``: the pinned ``@openai/codex`` Linux x64 package, fetched once from the npm
  registry at set-up, verified against its pinned sha512 and cached; nothing is
  downloaded at run time.
- ``gateway``: the only thing a Codex container can reach. It forwards the Responses API
  to the policy server, holds the episode to its fixed budget, records every call and
  keeps API keys out of the container.
- ``responses_api``: the Responses API as the gateway speaks it (bodies, event streams,
  usage) and its record of calls read back whole.
- ``network``: the internal Docker network and the relay through which a container
  reaches the gateway and nothing else.
- ``config``: Codex's ``config.toml`` and model catalog entry for an episode, and what a
  run's manifest records of them (``probe``, ``scaffold``).
- ``backend``: one episode: binary and ``CODEX_HOME`` into the task container, ``codex
  exec``, the rollout out and imported into our trajectory format.
"""
