"""One module per lifecycle operation, each with its plan and its execution: ``cleanup`` and
``rollback`` (on the deletion engine, ``deletion``), ``backup``, ``restore``, ``start`` (a
query's run under its lock), ``bootstrap``, ``transplant`` and ``carry`` (the two carry-over
roads), ``backfill`` and ``migration``. The CLI, the DAG tasks and the Spark jobs call these.
"""
