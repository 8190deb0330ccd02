"""Codex-style tools the agent loop offers: shell, apply_patch, update_plan."""
