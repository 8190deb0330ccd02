"""Policy clients: how the agent loop asks a model for its next message.

Three wire protocols, one interface (``base.Policy``): OpenAI-compatible Chat Completions
(``openai_chat``: vLLM, SGLang), OpenAI Responses (``openai_responses``), Anthropic Messages
(``anthropic_messages``). Each client turns our ``Message`` records into a request, sends it
through the vendor SDK (the path production uses), and turns the answer back into one
generated assistant ``Message``. ``make.make_policy`` picks the client for a spec.
"""
