"""Checks the trainer's client and the services share (task files, harness names and options, SWE-bench
gradability): below every service, importing none."""
