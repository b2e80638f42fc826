"""Inference engines reached with token ids (the contract is :mod:`tito.types.engine`)."""
