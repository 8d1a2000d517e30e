"""Noise mechanisms: exact samplers and the mechanisms built on them."""
