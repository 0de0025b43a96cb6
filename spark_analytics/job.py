"""The audit job's entry point: `python -m spark_analytics ...` or `spark-submit spark_analytics/job.py ...`.

Exit status: 0 clean, or no discrepancy but alerts in doubt (`--in-doubt`: the operator
settles those); 1 discrepancies found, or (unless `--allow-gaps`) part of the window was
not recorded, so no all-clear can be given; 2 a bad command line or an unreadable
`--in-doubt` file.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file by spark-submit: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spark_analytics.in_doubt import InDoubtList
from spark_analytics.options import AuditOptions


def parse_time(text: str) -> int:
    """ISO 8601 (UTC when no offset) or a date, as epoch milliseconds."""
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--traces", required=True, help="the recorder's directory (date=/hour= partitions)")
    parser.add_argument("--since", help="start of the judged window (ISO 8601, UTC by default)")
    parser.add_argument("--until", help="end of the judged window, exclusive")
    parser.add_argument("--yesterday", action="store_true", help="judge the previous UTC day")
    parser.add_argument("--master", help="Spark master URL (default local[2], or spark-submit's)")
    parser.add_argument("--driver-memory", default="2g",
                        help="Spark driver heap (local mode: all of Spark's memory; default 2g)")
    parser.add_argument("--out", help="output directory (default: TRACES/_audit/<window>)")
    parser.add_argument("--book-ttl", type=float, default=None, help="book lifetime in seconds (default 60)")
    parser.add_argument("--grace", type=float, default=30.0, help="seconds an alert may take before it is missed")
    parser.add_argument("--late-after", type=float, default=5.0, help="detection latency (s) that counts as late")
    parser.add_argument("--delivery-grace", type=float, default=120.0, help="seconds a channel may take")
    parser.add_argument("--ttl-tolerance", type=float, default=2.0,
                        help="orders with an event this close (s) to their book's close get no verdict")
    parser.add_argument("--channel", action="append", default=[], help="a channel that must get every alert")
    parser.add_argument("--vhost", action="append", default=[],
                        help="judge only this deployment (RabbitMQ vhost; repeatable; default: every one traced)")
    parser.add_argument("--allow-gaps", action="store_true", help="exit 0 when the only problem is gaps")
    parser.add_argument("--in-doubt", action="append", default=[], metavar="FILE",
                        help="`aldebaran delivery in-doubt --json` output ('-': stdin; repeatable): alerts it lists "
                             "that no channel delivery shows are channel_in_doubt, not channel_missed")


def options_from(args: argparse.Namespace, book_ttl_default: float = 60.0) -> AuditOptions:
    since = parse_time(args.since) if args.since else None
    until = parse_time(args.until) if args.until else None
    if args.yesterday:
        today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        until = int(today.timestamp() * 1000)
        since = until - 86_400_000
    return AuditOptions(traces_dir=args.traces, since_ms=since, until_ms=until,
                        book_ttl_s=args.book_ttl if args.book_ttl is not None else book_ttl_default,
                        grace_s=args.grace, late_after_s=args.late_after, delivery_grace_s=args.delivery_grace,
                        ttl_tolerance_s=args.ttl_tolerance, channels=list(args.channel),
                        vhosts=list(args.vhost), in_doubt_files=list(args.in_doubt))


def run(opts: AuditOptions, master: str | None, out: str | None, allow_gaps: bool = False,
        spark: Any = None, memory: str = "2g", in_doubt: InDoubtList | None = None) -> tuple[int, dict[str, Any]]:
    """Run the audit with console progress; returns (exit status, summary). `in_doubt`: the list
    `opts.in_doubt_files` name, read by the caller already (so a missing file fails before Spark)."""
    from rich.console import Console

    from spark_analytics import report
    from spark_analytics.audit import input_bytes, run_audit

    console = Console(stderr=True)
    started = time.monotonic()
    with console.status("starting Spark") as status:
        if spark is None:
            from spark_analytics.session import spark_session
            spark = spark_session(master, memory=memory, input_bytes=input_bytes(opts))

        def step(text: str) -> None:
            console.log(f"[bold]audit[/]: {text}")
            status.update(text)
        result = run_audit(spark, opts, step, in_doubt)
        info = report.summary(result, opts, time.monotonic() - started)
        if out is None:
            label = "all" if opts.since_ms is None else report.iso(opts.since_ms)[:10]
            out = str(Path(opts.traces_dir) / "_audit" / label)
        step(f"writing Parquet, summary.json and report.html to {out}")
        paths = report.write_outputs(result, info, out)
        spark.catalog.clearCache()  # a shared session (tests, notebooks) gets its memory back
    info["audit_seconds"] = round(time.monotonic() - started, 2)
    info["trade_events_per_s"] = round(info["counts"]["trade_events_decoded"] / max(info["audit_seconds"], 1e-3))
    Path(paths["summary"]).write_text(json.dumps(info, indent=2))  # with the final run time
    console.print(_table(info))
    console.print(f"report: {paths['report']}")
    return exit_status(info["verdict"], allow_gaps), info


def exit_status(verdict: str, allow_gaps: bool = False) -> int:
    """0 when nothing needs the operator's judgement beyond the in-doubt list (and, with
    `--allow-gaps`, the unaudited windows); 1 otherwise."""
    return 0 if verdict in ("clean", "in_doubt") or (allow_gaps and verdict == "unaudited") else 1


def _table(info: dict[str, Any]) -> Any:
    """The console's verdict: one column per deployment, the findings and what was skipped."""
    from rich.table import Table

    from spark_analytics.stats import FINDINGS, IN_DOUBT, JUNK_TOTAL

    table = Table(title=f"audit: {info['verdict']} ({info['audit_seconds']} s, "
                        f"{info['trade_events_per_s']:,} trade events/s)")
    table.add_column("what")
    deployments = info["deployments"]
    for v in deployments:
        table.add_column(v, justify="right")
    rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("verdict", lambda d: d["verdict"]), ("trade events", lambda d: f"{d['counts']['trade_events_decoded']:,}")]
    rows += [(k, partial(_counted, k)) for k in FINDINGS]
    if info["in_doubt_list"] is not None:  # not a discrepancy: the operator settles these
        rows += [(IN_DOUBT, partial(_counted, IN_DOUBT))]
    rows += [("junk skipped", lambda d: str(sum(d["counts"].get(k, 0) for k in JUNK_TOTAL))),
             ("unaudited windows", lambda d: str(len(d["unaudited_windows"])))]
    for name, cell in rows:
        table.add_row(name, *[cell(d) for d in deployments.values()])
    return table


def _counted(key: str, deployment: dict[str, Any]) -> str:
    return str(deployment["counts"][key])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="spark_analytics", description="Audit alerts against firehose traces.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    opts = options_from(args)
    try:
        listed = read_in_doubt_files(opts)
    except OSError as exc:
        parser.error(f"--in-doubt: {exc}")
    code, _ = run(opts, args.master, args.out, args.allow_gaps, memory=args.driver_memory, in_doubt=listed)
    return code


def read_in_doubt_files(opts: AuditOptions) -> InDoubtList | None:
    """The `--in-doubt` list(s), read before Spark starts; None without the flag. OSError when unreadable."""
    from spark_analytics.in_doubt import read

    return read(opts.in_doubt_files) if opts.in_doubt_files else None


if __name__ == "__main__":
    raise SystemExit(main())
