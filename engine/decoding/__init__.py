"""Decoding: the call (``decoder``), one module per mode, token choice, logits controls, streaming."""
