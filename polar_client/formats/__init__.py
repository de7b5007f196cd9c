"""Task formats besides Polar's own ``TASK.yaml``: each module has ``detect(path)`` and ``task_mappings(path)``.

(Placeholder on the ``harbor`` branch: the format dispatcher with its registry comes from the ``swebench`` branch;
``harbor`` is its Harbor / Terminal-Bench entry.)
"""

from __future__ import annotations
