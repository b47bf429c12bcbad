"""spark-submit entry point: data-level integrity of a registered query's state (Great
Expectations), after file-level verification.

    spark-submit spark_jobs/validate_state.py --query user_sessions [--batch N] [--registry FILE]

Exit codes: 0 every expectation holds, 1 some failed (summary and Data Docs path printed),
2 bad input or a checkpoint that fails file-level verification.
"""

from __future__ import annotations

import argparse
import json
import sys

from stateops.control.audit import audit_dir
from stateops.core.access import refuse_unwritable
from stateops.core.checkpoint import load_checkpoint
from stateops.core.errors import StateOpsError, domain_errors, one_line
from stateops.core.registry import Query, load_registry
from stateops.core.verify import format_findings, verify_checkpoint


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="validate_state.py", description=__doc__.splitlines()[0])
    parser.add_argument("--query", required=True)
    parser.add_argument("--batch", type=int, help="a committed batch (default: the last)")
    parser.add_argument("--registry")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    return parser.parse_args(argv)


def preflight(args: argparse.Namespace) -> Query:
    """The query to validate; refuses without Spark (run before spark-submit too) a registry or
    query that is not there, a checkpoint that fails file-level verification, and a batch that
    is not committed."""
    query = load_registry(args.registry).query(args.query)
    files = verify_checkpoint(query.checkpoint)
    if not files["ok"]:
        print(format_findings(files), end="", file=sys.stderr)
        raise StateOpsError(f"{query.checkpoint}: fails file-level verification; see above")
    committed = files["last_committed_batch"]
    if committed is None:
        raise StateOpsError(f"{query.checkpoint}: no committed batch yet: no state to validate")
    if args.batch is not None:
        load_checkpoint(query.checkpoint).restart_files(args.batch)  # committed, files there
    # Great Expectations keeps its context and Data Docs in the audit folder.
    refuse_unwritable(f"validation of {query.name}", write=[audit_dir(query.checkpoint) / "gx"])
    return query


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        with domain_errors():
            query = preflight(args)
            from stateops.spark.expectations import format_validation, validate_state
            from stateops.spark.streaming import spark_session

            spark = spark_session(f"stateops-validate-{query.name}")
            result = validate_state(spark, query, args.batch)
    except StateOpsError as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    print(
        json.dumps(result) if args.json else format_validation(result),
        end="\n" if args.json else "",
    )
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
