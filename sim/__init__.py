"""A self-contained, deterministic shopping simulator speaking ShopSimulator's protocol.

Usable alone (`python -m sim demo|serve`); never imports JAX or the trainer.
"""
