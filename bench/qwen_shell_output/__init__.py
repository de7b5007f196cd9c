"""Whether Qwen Code's shell tool hands the model a command's whole output (see ``__main__``)."""
