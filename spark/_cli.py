"""``magnetar spark submit JOB [-- JOB ARGS]``: run one of :mod:`spark.jobs`.

The job runs in this process with its own ``local[2]`` SparkSession unless ``--master``
names another; ``magnetar spark list`` shows the jobs. ``spark-submit spark/jobs/JOB.py``
runs the same entry points on a cluster.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from gateway._cli import Command, register_command

__all__ = ["run_job"]


def _arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="spark_command", metavar="ACTION", required=True)
    submit = sub.add_parser("submit", help="run an example job",
                            description="Run a job of spark.jobs; arguments after JOB go to the job.")
    submit.add_argument("job", metavar="JOB", help="job name (see `magnetar spark list`)")
    submit.add_argument("--master", default=None, help="Spark master URL (default local[2])")
    submit.add_argument("job_args", nargs=argparse.REMAINDER, help="the job's own arguments")
    sub.add_parser("list", help="list the example jobs")


def run_job(name: str, argv: list[str], master: str | None = None) -> int:
    """Run job ``name`` of :data:`spark.jobs.JOBS` with ``argv``; returns its exit code."""
    from spark.jobs import JOBS

    if name not in JOBS:
        print(f"magnetar: error: no Spark job {name!r} (jobs: {', '.join(sorted(JOBS))})", file=sys.stderr)
        return 2
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master:
        argv = ["--master", master, *argv]
    module = importlib.import_module(JOBS[name])
    return int(module.main(argv) or 0)


def _run(args: argparse.Namespace) -> int:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        print("magnetar: error: magnetar spark needs PySpark and a Java runtime: "
              "pip install 'magnetar[spark]' (make test installs both)", file=sys.stderr)
        return 1
    from spark.jobs import JOBS

    if args.spark_command == "list":
        for name, module in sorted(JOBS.items()):
            doc = (importlib.import_module(module).__doc__ or "").strip().splitlines()
            print(f"{name:<16} {doc[0] if doc else ''}")
        return 0
    job_args = list(args.job_args)
    if job_args[:1] == ["--"]:
        job_args = job_args[1:]
    return run_job(args.job, job_args, args.master)


register_command(Command(
    "spark",
    "run the example Spark jobs on Magnetar topics",
    _arguments,
    _run,
    "Spark on the unified stream: `magnetar spark submit JOB -- ARGS` runs a job of spark.jobs.",
))
