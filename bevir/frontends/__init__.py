"""Frontends: ONNX and PyTorch importers."""
