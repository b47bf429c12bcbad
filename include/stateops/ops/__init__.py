"""One module per lifecycle operation, each with its plan and its execution, on a
:class:`stateops.control.target.Target`: ``cleanup`` and ``rollback`` (on the deletion engine,
``deletion``), ``backup``, ``restore``, ``start`` (a query's run under its lock),
``bootstrap``, ``transplant`` and ``carry`` (the two carry-over roads), ``repartition``,
``backfill`` and ``migration``; ``pending`` (what an interrupted operation left) and ``jobs``
(what each Spark job does with its arguments). The CLI, the DAG tasks and the Spark jobs call
these.
"""
