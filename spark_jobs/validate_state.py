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

from stateops.errors import StateOpsError
from stateops.registry import load_registry
from stateops.verify import format_findings, verify_checkpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="validate_state.py", description=__doc__.splitlines()[0])
    parser.add_argument("--query", required=True)
    parser.add_argument("--batch", type=int, help="a committed batch (default: the last)")
    parser.add_argument("--registry")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        query = load_registry(args.registry).query(args.query)
        files = verify_checkpoint(query.checkpoint)
        if not files["ok"]:
            print(format_findings(files), end="", file=sys.stderr)
            raise StateOpsError(f"{query.checkpoint}: fails file-level verification; see above")
        from stateops.expectations import format_validation, validate_state
        from stateops.streaming import spark_session

        spark = spark_session(f"stateops-validate-{query.name}")
        result = validate_state(spark, query, args.batch)
    except StateOpsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(
        json.dumps(result) if args.json else format_validation(result),
        end="\n" if args.json else "",
    )
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
