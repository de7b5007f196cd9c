"""Every registered harness on the same scripted tool loop: what it sends and what a trainer gets from it."""
