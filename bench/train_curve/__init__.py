"""The reward curve of the reference trainer with SmolLM2-135M-Instruct through the real pi CLI."""
