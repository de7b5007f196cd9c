"""What a trainer pays for ``import polar_client``: the client and the layers below it, no service."""

from __future__ import annotations

import subprocess
import sys

_SERVICES = ("rollout_server", "gateway", "model_proxy", "reconstructor", "evaluator", "runtimes", "polar_run")


def test_importing_the_client_imports_no_service_package() -> None:
    probe = f"import sys, polar_client\nprint(sorted({{m.split('.')[0] for m in sys.modules}} & set({_SERVICES!r})))"
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"
