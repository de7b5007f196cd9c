"""``python -m polar_core`` runs the ``polar`` command."""

from __future__ import annotations

from polar_core.cli import main

main()
