"""Stand-ins for testing code around the context-assembly service: the service's own tests,
benchmarks and examples use them, and so can an application's.

- :class:`ScriptedContributor` (:mod:`.scripted`): a loopback webhook contributor whose every
  call follows a script of :class:`Step`: an answer (revision, blocks, summary, status), a delay,
  a wait for other calls, or a fault (hang, drip, late answer, reset, oversize, invalid JSON);
  every call recorded, with events to wait on. Its script and record are :mod:`.script`'s, the
  HTTP/1.1 and the faults it writes :mod:`.wire`'s.
- :class:`ServedProcess` (:mod:`.processes`): a server in a process of its own on a free
  loopback port, waited for until it answers, stopped by SIGTERM; :func:`start_service`
  (``context-assembly serve``), :func:`start_app` (an ASGI app under uvicorn) and
  :func:`start_contributor` (the scripted double as a process).

Nothing here needs more than the client's own dependencies and the standard library; the
processes started need what they run (the service, uvicorn) installed.
"""

from context_assembly_client.testing.processes import (
    ServedProcess,
    executable,
    free_port,
    service_command,
    start_app,
    start_contributor,
    start_service,
)
from context_assembly_client.testing.scripted import (
    DEFAULT_BLOCKS,
    Call,
    Event,
    Fault,
    Handler,
    ScriptedContributor,
    Step,
)

__all__ = [
    "DEFAULT_BLOCKS",
    "Call",
    "Event",
    "Fault",
    "Handler",
    "ScriptedContributor",
    "ServedProcess",
    "Step",
    "executable",
    "free_port",
    "service_command",
    "start_app",
    "start_contributor",
    "start_service",
]
