"""The preparation lifecycle behind the HTTP routes.

* ``operations``: the operations (prepare, budget, get, validate, refresh, repair, usage);
* ``usage``: a usage report recorded, and what the usage operation answers;
* ``folding``: the compaction fold of ``summarize`` mode;
* ``record``: what a stored record holds, and the request shape hash refresh compares;
* ``targets``: where each contributor is called, and the calls of one round;
* ``staleness``: the reasons validate, repair and refresh refuse with;
* ``repair``: the structured-output repair frame;
* ``clock``: the injectable clocks.
"""

from context_assembly.preparations.clock import Clock
from context_assembly.preparations.operations import Preparations
from context_assembly.preparations.record import Prepared, new_preparation_id
from context_assembly.preparations.usage import RecordedUsage

__all__ = ["Clock", "Preparations", "Prepared", "RecordedUsage", "new_preparation_id"]
