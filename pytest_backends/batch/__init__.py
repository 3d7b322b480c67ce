"""Batch invariance: the same row gives the same bits whatever batch it is computed in."""
