"""What a model's graph is made of, read from the model alone: what onnxruntime can quantize in
it, how its nodes fall back together, its output head and its input lead-in.

Below both the passes (which quantize by it) and the evaluation (whose sensitivity measurement
reads it), so neither imports the other for it.
"""
