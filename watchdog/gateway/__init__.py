"""The admission gateway: an OpenAI-compatible pass-through in front of one vLLM target."""
