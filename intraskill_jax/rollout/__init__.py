"""Rollout engines behind one protocol: the embedded JAX sampler, SGLang, scripted engines."""
