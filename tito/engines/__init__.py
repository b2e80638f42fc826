"""Inference engines reached with token ids (protocol in :mod:`tito.engines.base`)."""
