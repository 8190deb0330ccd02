"""Scripted stand-ins of a model server, used by `relearn demo`, the benches and the tests.

- ``servers``: local HTTP servers that answer over the OpenAI Chat Completions, OpenAI
  Responses or Anthropic Messages protocol from a script of ``ScriptedTurn``s.
- ``solutions``: scripted policies on the mini tasks (a solver, a flailer, the ``historical``
  checkpoint that `relearn demo` collects from).
- ``single_turn_judges``: the scripted keep judge and auditor of the mini single-turn suite.
- ``codex_sessions``: Codex rollout lines in the published format, for the import paths.
"""
