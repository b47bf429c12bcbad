"""Who may change a checkpoint, and what they did: the lifecycle lock and holds, the audit log,
and the fault points where crashes are rehearsed. Imports only ``stateops.core``.
"""
