"""For demos and tests, never for a production checkpoint: the embedded S3 endpoint and the
deterministic sample data. Imports only ``stateops.core``.
"""
