"""Who may change a checkpoint, and what they did: what an operation acts on (``target``: the
checkpoint, its registry and owning query, which hand out its lock and backup location), the
lifecycle lock and holds, the audit log, and the fault points where crashes are rehearsed.
Imports only ``stateops.core``.
"""
