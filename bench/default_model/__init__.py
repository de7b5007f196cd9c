"""Benchmark of the main job's default model path: SmolLM2-135M-Instruct sampled in process (``transformers``)."""
