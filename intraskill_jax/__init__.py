"""IntraSkill-JAX: skill-model co-evolution for LLM shopping agents, in JAX."""

__version__ = "0.1.0"
