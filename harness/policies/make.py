"""One policy client for a spec, by its kind."""

from __future__ import annotations

from harness.policies.anthropic_messages import AnthropicPolicy
from harness.policies.base import Policy, PolicySpec, SdkPolicy
from harness.policies.openai_chat import ChatPolicy
from harness.policies.openai_responses import ResponsesPolicy

CLIENTS: dict[str, type[SdkPolicy]] = {"chat": ChatPolicy, "responses": ResponsesPolicy, "anthropic": AnthropicPolicy}


def make_policy(spec: PolicySpec) -> Policy:
    return CLIENTS[spec.kind](spec)
