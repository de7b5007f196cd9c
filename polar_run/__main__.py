"""``python -m polar_run`` runs the ``polar`` command."""

from __future__ import annotations

from polar_run.cli import main

main()
