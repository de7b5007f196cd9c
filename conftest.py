"""Suite-wide test configuration.

Services refuse task paths outside their operator's ``task_roots`` (default: the working directory). Tests keep
their repositories under the temporary directory, so the suite lets the services read tasks from there and from
the checkout, unless the environment already says otherwise; tests of the roots themselves set them explicitly.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

_ROOTS = json.dumps([tempfile.gettempdir(), str(Path(__file__).resolve().parent)])
for _service in ("GATEWAY", "EVALUATOR", "ROLLOUT"):
    os.environ.setdefault(f"POLAR_{_service}_TASK_ROOTS", _ROOTS)
